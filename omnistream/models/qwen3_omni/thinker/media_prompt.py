"""A chat with media as the thinker's prompt: ids, encoder inputs and 3-D positions.

The real Qwen3-Omni processor does the work (Whisper features for audio, the Qwen2-VL image recipe,
placeholder expansion, video/audio interleaving with `use_audio_in_video`), so a prompt is the very
one the reference builds from the same decoded arrays. Ids come from our `ChatEncoder` (a user's
special-token strings stay text) with each template placeholder expanded by the processor's own
replacement string. Everything here is CPU work for the servicer's thread pool, never the event loop
or the engine thread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from omnistream.engine.chat_encoding import ChatEncoder, Tools
from omnistream.models.qwen3_omni.thinker.audio_features import CachedAudioFeatures
from omnistream.models.qwen3_omni.thinker.frame_video import FrameVideoProcessor
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import (
    AUDIO_SAMPLE_RATE,
    AudioInput,
    ImageInput,
    MediaLayout,
    VideoInput,
    parts_of,
)

# Media a single request may bring (the gateway has its own, usually tighter, limits).
MAX_AUDIO_SECONDS = 20 * 60
MAX_ITEMS = 64
MAX_PIXELS = 4096 * 4096
MAX_FRAMES = 2048


def load_processor(model_dir: str | Path, tokenizer: Any) -> Any:
    """`Qwen3OmniMoeProcessor` of a checkpoint, without torchvision: the feature extractor and the
    PIL image processor are transformers' own; the video processor is `FrameVideoProcessor`."""
    from transformers import Qwen3OmniMoeProcessor, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class Processor(Qwen3OmniMoeProcessor):
        """The real processor; only its constructor's class check of the video processor is relaxed
        (it looks up `BaseVideoProcessor`, which transformers only exposes with torchvision)."""

        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and isinstance(argument, FrameVideoProcessor):
                return FrameVideoProcessor
            return super().check_argument_for_proper_class(argument_name, argument)  # type: ignore[no-untyped-call]

    return Processor(  # type: ignore[no-untyped-call]
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(str(model_dir)),
        video_processor=FrameVideoProcessor.from_pretrained(model_dir),
        feature_extractor=WhisperFeatureExtractor.from_pretrained(str(model_dir)),
        tokenizer=tokenizer,
    )


@dataclass
class MediaPrompt:
    """What the thinker runs for a prompt with media (built on the CPU with float32 features; the
    engine moves the features to its device and dtype when it admits the request, see `to`)."""

    prompt_ids: list[int]
    positions: torch.Tensor  # [3, L] float: the model's M-RoPE positions of the prompt
    rope_delta: float  # decode position = sequence position + rope_delta
    audio_features: list[torch.Tensor] = field(default_factory=list)  # per audio: [mel, frames]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    layout: MediaLayout = field(default_factory=MediaLayout)  # what the talker needs of the media

    @property
    def audio_frames(self) -> int:
        return sum(int(f.shape[1]) for f in self.audio_features)

    def to(self, device: torch.device | str, dtype: torch.dtype) -> MediaPrompt:
        """The encoder inputs on the engine's device and in its dtype: the engine moves them once,
        when it admits the request, so no caller and no later step has to get this right (a float32
        feature reaching a bfloat16 encoder on CUDA fails the request). Positions and grids stay on
        the CPU: they are indexed per prefill chunk and moved with it."""

        def cast(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device=device, dtype=dtype)

        return dataclasses.replace(
            self,
            audio_features=[f.to(device=device, dtype=dtype) for f in self.audio_features],
            pixel_values=cast(self.pixel_values),
            pixel_values_videos=cast(self.pixel_values_videos),
        )


@dataclass
class _Collected:
    images: list[np.ndarray] = field(default_factory=list)
    videos: list[np.ndarray] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)
    audio_slots: list[int | None] = field(default_factory=list)  # None: standalone, i: videos[i]
    fps: set[float] = field(default_factory=set)


def check_media(messages: Sequence[Mapping[str, Any]], use_audio_in_video: bool) -> _Collected:
    """The media of a chat in prompt order, checked (types, shapes, dtypes, rates, sizes) so a bad
    item is refused here, naming it, and never reaches a batch."""
    got = _Collected()
    for i, message in enumerate(messages):
        content = message.get("content", "")
        if not isinstance(content, str) and not isinstance(content, Sequence):
            raise InvalidRequest(
                f"messages[{i}].content must be a string or a list of parts", field="messages"
            )
        for j, part in enumerate(parts_of(content)):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(part, Mapping):
                raise InvalidRequest(f"{where} must be a part ({{'type': ...}})", field="messages")
            kind = part.get("type")
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    raise InvalidRequest(f"{where}.text must be a string", field="messages")
            elif kind == "audio":
                got.audio.append(_audio(part.get("audio"), f"{where}.audio"))
                got.audio_slots.append(None)
            elif kind == "image":
                got.images.append(_image(part.get("image"), f"{where}.image"))
            elif kind == "video":
                video = part.get("video")
                if not isinstance(video, VideoInput):
                    raise InvalidRequest(f"{where}.video must be a video", field="messages")
                got.videos.append(_frames(video.frames, f"{where}.video.frames"))
                if not (np.isfinite(video.fps) and 0 < video.fps <= 240):
                    raise InvalidRequest(f"{where}.video.fps must be in (0, 240]", field="messages")
                got.fps.add(float(video.fps))
                if use_audio_in_video:
                    if video.audio is None:
                        # The reference places every video's sound by the frames; it has no silent case.
                        raise InvalidRequest(
                            f"{where}.video has no audio but use_audio_in_video is set", field="messages"
                        )
                    got.audio.append(_audio(video.audio, f"{where}.video.audio"))
                    got.audio_slots.append(len(got.videos) - 1)
            else:
                raise InvalidRequest(f"{where}.type must be text, audio, image or video", field="messages")
    if len(got.images) + len(got.videos) + len(got.audio) > MAX_ITEMS:
        raise InvalidRequest(f"a request may bring at most {MAX_ITEMS} media items", field="messages")
    if len(got.fps) > 1:
        # The processor times every video of a prompt by one frame rate.
        raise InvalidRequest("all videos of a request must have the same fps", field="messages")
    return got


def _audio(audio: Any, where: str) -> np.ndarray:
    if not isinstance(audio, AudioInput):
        raise InvalidRequest(f"{where} must be audio", field="messages")
    if audio.sample_rate != AUDIO_SAMPLE_RATE:
        raise InvalidRequest(f"{where}.sample_rate must be {AUDIO_SAMPLE_RATE}", field="messages")
    samples = audio.samples
    if not isinstance(samples, np.ndarray) or samples.dtype != np.float32 or samples.ndim != 1:
        raise InvalidRequest(f"{where}.samples must be float32 of shape [n]", field="messages")
    if not 0 < samples.size <= MAX_AUDIO_SECONDS * AUDIO_SAMPLE_RATE:
        raise InvalidRequest(f"{where} must be 1 sample to {MAX_AUDIO_SECONDS} s long", field="messages")
    if not np.isfinite(samples).all():
        raise InvalidRequest(f"{where}.samples hold NaN or infinite values", field="messages")
    return samples


def _image(image: Any, where: str) -> np.ndarray:
    if not isinstance(image, ImageInput):
        raise InvalidRequest(f"{where} must be an image", field="messages")
    pixels = image.pixels
    if (
        not isinstance(pixels, np.ndarray)
        or pixels.dtype != np.uint8
        or pixels.ndim != 3
        or pixels.shape[2] != 3
    ):
        raise InvalidRequest(f"{where}.pixels must be uint8 of shape [height, width, 3]", field="messages")
    if not 0 < pixels.shape[0] * pixels.shape[1] <= MAX_PIXELS:
        raise InvalidRequest(f"{where} must have 1 to {MAX_PIXELS} pixels", field="messages")
    return pixels


def _frames(frames: Any, where: str) -> np.ndarray:
    if (
        not isinstance(frames, np.ndarray)
        or frames.dtype != np.uint8
        or frames.ndim != 4
        or frames.shape[3] != 3
    ):
        raise InvalidRequest(f"{where} must be uint8 of shape [frames, height, width, 3]", field="messages")
    if not 0 < frames.shape[0] <= MAX_FRAMES or not 0 < frames.shape[1] * frames.shape[2] <= MAX_PIXELS:
        raise InvalidRequest(
            f"{where}: 1 to {MAX_FRAMES} frames of 1 to {MAX_PIXELS} pixels", field="messages"
        )
    return frames


def processor_inputs(rendered: str, media: _Collected, use_audio_in_video: bool) -> dict[str, Any]:
    """The processor call the reference makes for these arrays (tests call it for the reference)."""
    kwargs: dict[str, Any] = {"text": [rendered], "return_tensors": "pt"}
    if media.images:
        kwargs["images"] = list(media.images)
    if media.videos:
        kwargs["videos"] = list(media.videos)
        kwargs["videos_kwargs"] = {"fps": next(iter(media.fps))}
    if media.audio:
        kwargs["audio"] = list(media.audio)
    if use_audio_in_video and media.videos:
        kwargs["load_audio_from_video"] = True
        kwargs["audio_from_video_indices"] = list(media.audio_slots)
    return kwargs


class SettledAudio(NamedTuple):
    """A prompt's settled audio items as the processor would have given them (`_settled_audio`)."""

    features: list[torch.Tensor]  # per item: [mels, frames]
    lengths: torch.Tensor  # per item: its frames (long)
    replacements: list[str]  # per item: its placeholder's replacement text


class MediaPromptBuilder:
    def __init__(self, processor: Any, chat: ChatEncoder, thinker: Any, max_model_len: int) -> None:
        self.processor = processor
        self.chat = chat
        self.thinker = thinker  # for `get_rope_index` (a pure function of ids, grids and config)
        self.max_model_len = max_model_len
        tok = processor.tokenizer
        self.placeholders = {tok.audio_token_id, tok.image_token_id, tok.video_token_id}
        self._placeholder_text = {i: tok.convert_ids_to_tokens(i) for i in self.placeholders}
        # A replacement is one placeholder repeated, or a video's interleaving: the same few recur.
        self._replacement_ids: dict[str, list[int]] = {}
        # A lone audio item's replacement by its feature frames (`_settled_audio`); None: that path
        # found the processor disagreeing once, and every prompt goes through the processor.
        self._audio_replacements: dict[int, str] | None = {}

    def build(
        self, messages: list[dict[str, Any]], use_audio_in_video: bool, tools: Tools = None
    ) -> MediaPrompt:
        media = check_media(messages, use_audio_in_video)  # first: it checks the parts' form too
        self.chat.check(messages, tools)
        rendered, cut = self.chat.render(messages, tools)
        ids = self.chat.tokenize(rendered, cut)
        # The processor is given the placeholders alone, in prompt order: each one's replacement
        # depends on its media only, and the text around them (which the processor would tokenize,
        # a whole conversation at every turn) is tokenized by `chat` already.
        placeholders = "".join(self._placeholder_text[t] for t in ids if t in self.placeholders)
        audio = self._settled_audio(media)
        if audio is not None:  # a conversation's spoken turns: no processor call at all
            out: Any = {}
            replacements = audio.replacements
        else:
            try:
                out = self.processor(
                    **processor_inputs(placeholders, media, use_audio_in_video),
                    return_text_replacement_offsets=True,
                )
            except ValueError as exc:  # e.g. a frame size the video processor refuses
                raise InvalidRequest(f"media cannot be processed: {exc}", field="messages") from exc
            replacements = [r["replacement"] for r in out["text_replacement_offsets"][0]]
        prompt_ids = self._expand(ids, replacements)
        if len(prompt_ids) > self.max_model_len:
            raise InvalidRequest(
                f"the prompt ({len(prompt_ids)} tokens with its media) exceeds the model length "
                f"{self.max_model_len}",
                field="messages",
            )
        return self._prompt(prompt_ids, out, use_audio_in_video, audio)

    def _settled_audio(self, media: _Collected) -> SettledAudio | None:
        """The features, frame lengths and replacements of a prompt whose media are settled audio items
        only (a realtime conversation's spoken turns), item by item from the feature cache, without
        the processor: it would tokenize the whole expanded placeholder text (the conversation's
        every audio token, ~1.4 ms at 20 turns) and assemble a padded batch, all to be thrown away.
        Exact: a settled item's features are the same alone as in any batch (audio_features.py),
        and an audio item's replacement depends on its frame count only, taken once per count
        from the processor's own call on the item alone (and checked against it). None: the
        processor's path (other media, an unsettled item, no feature cache)."""
        extractor = self.processor.feature_extractor
        if (
            self._audio_replacements is None
            or media.images
            or media.videos
            or not media.audio
            or not isinstance(extractor, CachedAudioFeatures)
            or extractor.budget_bytes <= 0
            or not all(map(extractor.settled, media.audio))
        ):
            return None
        features, lengths, replacements = [], [], []
        for samples in media.audio:
            rows, mask = extractor.item(samples, AUDIO_SAMPLE_RATE)  # [mels, n], [n]: its frames only
            n = int(mask.sum())
            replacement = self._audio_replacements.get(n)
            if replacement is None:
                replacement = self._audio_replacement(samples, rows, n)
                if replacement is None:
                    return None
            features.append(rows)
            lengths.append(n)
            replacements.append(replacement)
        return SettledAudio(features, torch.tensor(lengths, dtype=torch.long), replacements)

    def _audio_replacement(self, samples: np.ndarray, rows: torch.Tensor, n: int) -> str | None:
        """The processor's replacement for one audio item of `n` frames, from its call on the item
        alone; None (and the processor's path from now on) if its features are not `rows`."""
        assert self._audio_replacements is not None
        alone = _Collected(audio=[samples], audio_slots=[None])
        out = self.processor(
            **processor_inputs(self._placeholder_text[self.processor.tokenizer.audio_token_id], alone, False),
            return_text_replacement_offsets=True,
        )
        same = int(out["feature_attention_mask"][0].sum()) == n and torch.equal(
            out["input_features"][0, :, :n], rows
        )
        if not same:
            self._audio_replacements = None
            return None
        replacement = str(out["text_replacement_offsets"][0][0]["replacement"])
        self._audio_replacements[n] = replacement
        return replacement

    def _expand(self, ids: list[int], replacements: list[str]) -> list[int]:
        """Each template placeholder (in order) becomes the ids of the processor's replacement."""
        pending = iter(replacements)
        out: list[int] = []
        for token in ids:
            if token in self.placeholders:
                text = next(pending, None)
                if text is None:
                    raise InvalidRequest("the prompt has more placeholders than media", field="messages")
                expanded = self._replacement_ids.get(text)
                if expanded is None:
                    expanded = self.processor.tokenizer.encode(text, add_special_tokens=False)
                    if len(self._replacement_ids) >= 4096:
                        self._replacement_ids.clear()
                    self._replacement_ids[text] = expanded
                out += expanded
            else:
                out.append(token)
        if next(pending, None) is not None:
            raise InvalidRequest("the prompt has fewer placeholders than media", field="messages")
        return out

    def _prompt(
        self,
        prompt_ids: list[int],
        out: Any,
        use_audio_in_video: bool,
        audio: SettledAudio | None = None,
    ) -> MediaPrompt:
        features: list[torch.Tensor] = []
        lengths = None
        if audio is not None:
            features, lengths = audio.features, audio.lengths
        elif "input_features" in out:
            lengths = out["feature_attention_mask"].sum(-1)
            features = [
                f[:, : int(n)].contiguous() for f, n in zip(out["input_features"], lengths, strict=True)
            ]
        second_per_grid = out.get("video_second_per_grid")
        positions, delta = self.thinker.model.get_rope_index(
            torch.tensor([prompt_ids]),
            out.get("image_grid_thw"),
            out.get("video_grid_thw"),
            torch.ones(1, len(prompt_ids), dtype=torch.long),
            use_audio_in_video,
            lengths,
            torch.as_tensor(second_per_grid) if second_per_grid is not None else None,
        )
        return MediaPrompt(
            prompt_ids=prompt_ids,
            positions=positions[:, 0].float(),
            rope_delta=float(delta.reshape(-1)[0]),
            audio_features=features,
            pixel_values=out.get("pixel_values"),
            image_grid_thw=out.get("image_grid_thw"),
            pixel_values_videos=out.get("pixel_values_videos"),
            video_grid_thw=out.get("video_grid_thw"),
            layout=MediaLayout(
                image_grid_thw=_triples(out.get("image_grid_thw")),
                video_grid_thw=_triples(out.get("video_grid_thw")),
                video_second_per_grid=tuple(float(x) for x in second_per_grid or ()),
                audio_feature_lengths=tuple(int(n) for n in lengths) if lengths is not None else (),
            ),
        )


def _triples(grid: torch.Tensor | None) -> tuple[tuple[int, int, int], ...]:
    return () if grid is None else tuple((int(t), int(h), int(w)) for t, h, w in grid.tolist())
