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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from omnistream.engine.chat_encoding import ChatEncoder, Tools
from omnistream.engine.token_memo import TokenMemo
from omnistream.models.qwen3_omni.thinker.audio_features import CachedAudioFeatures
from omnistream.models.qwen3_omni.thinker.audio_rows import audio_tokens
from omnistream.models.qwen3_omni.thinker.frame_video import FrameVideoProcessor
from omnistream.models.qwen3_omni.thinker.media_checks import Collected, check_media, processor_inputs
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import AUDIO_SAMPLE_RATE, MediaLayout


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
    # Per kind, each item's content digest for prefix caching (media_item.py's `item_digests`),
    # taken off the engine thread; None: the engine takes them.
    digests: dict[str, list[bytes]] | None = None

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


class SettledAudio(NamedTuple):
    """A prompt's settled audio items as the processor would have given them (`_settled_audio`)."""

    features: list[torch.Tensor]  # per item: [mels, frames]
    lengths: torch.Tensor  # per item: its frames (long)
    replacements: list[str]  # per item: its placeholder's replacement text


def continued(media: MediaPrompt, answer: list[int]) -> MediaPrompt:
    """The media prompt with `answer` after it (a request resumed with its answer so far): text at
    the positions decoding would have given it, its sequence position + rope_delta in all three."""
    n, length = len(answer), len(media.prompt_ids)
    after = torch.arange(length, length + n, dtype=media.positions.dtype) + media.rope_delta
    positions = torch.cat([media.positions, after.expand(3, n)], dim=1)
    return dataclasses.replace(media, prompt_ids=media.prompt_ids + list(answer), positions=positions)


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
        # Is a count's replacement the audio placeholder times the encoder's rows of it
        # (`audio_tokens`, the processor's rule)? Checked on the first count the processor gave
        # (None: not yet); then a new count needs no processor call (a realtime turn's length is
        # new every turn, and that call computes its features once more, a cost that grows with it).
        self._replacement_rule: bool | None = None
        # Are an audio-only prompt's M-RoPE positions its sequence indexes (delta 0)? The model's
        # rule gives audio and text consecutive positions; checked on the first such prompt against
        # `get_rope_index` (None: not yet), which runs for every prompt when it is not so.
        self._audio_positions_sequential: bool | None = None

    def build(
        self,
        messages: list[dict[str, Any]],
        use_audio_in_video: bool,
        tools: Tools = None,
        memo: TokenMemo | None = None,
        ahead: bool = False,
    ) -> MediaPrompt:
        """`memo`: the conversation's (its cache scope's) last prompt text, which its next one
        starts with: only the rest is tokenized (omnistream/engine/token_memo.py). `ahead`: the
        audio is a turn still spoken (ThinkerParams.encode_only), whose log-mel frames are kept
        for its commit (turn_frames.py)."""
        media = check_media(messages, use_audio_in_video)  # first: it checks the parts' form too
        extractor = self.processor.feature_extractor
        if ahead and isinstance(extractor, CachedAudioFeatures):
            for samples in media.audio:
                extractor.turns.keep(samples)
        self.chat.check(messages, tools)
        rendered, cut = self.chat.render(messages, tools)
        ids = self.chat.tokenize(rendered, cut, memo)
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

    def _settled_audio(self, media: Collected) -> SettledAudio | None:
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
            rows, _ = extractor.item(samples, AUDIO_SAMPLE_RATE)  # [mels, n], [n]: its frames only
            n = int(rows.shape[1])
            replacement = self._audio_replacements.get(n)
            if replacement is None and self._replacement_rule:
                replacement = self._audio_replacements[n] = self._counted_replacement(n)
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
        alone = Collected(audio=[samples], audio_slots=[None])
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
        if self._replacement_rule is None:
            self._replacement_rule = self._counted_replacement(n) == replacement
        return replacement

    def _counted_replacement(self, n: int) -> str:
        """The processor's rule for an audio item of `n` frames: its placeholder once per row the
        encoder makes of them."""
        audio = str(self._placeholder_text[self.processor.tokenizer.audio_token_id])
        return audio * audio_tokens(n, int(self.thinker.config.audio_config.n_window))

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
        audio_only = out.get("image_grid_thw") is None and out.get("video_grid_thw") is None
        if audio_only and self._audio_positions_sequential:
            # The rule checked below: consecutive positions, which a conversation's turns would
            # otherwise walk item by item through `get_rope_index` (0.2 ms at twenty spoken turns).
            positions, delta = torch.arange(len(prompt_ids)).view(1, 1, -1).expand(3, 1, -1), 0.0
        else:
            positions, delta = self.thinker.model.get_rope_index(
                torch.tensor([prompt_ids]),
                out.get("image_grid_thw"),
                out.get("video_grid_thw"),
                torch.ones(1, len(prompt_ids), dtype=torch.long),
                use_audio_in_video,
                lengths,
                torch.as_tensor(second_per_grid) if second_per_grid is not None else None,
            )
            if audio_only and self._audio_positions_sequential is None:
                sequential = torch.arange(len(prompt_ids)).expand(3, -1)
                self._audio_positions_sequential = bool(
                    torch.equal(positions[:, 0], sequential) and float(delta.reshape(-1)[0]) == 0.0
                )
        return MediaPrompt(
            prompt_ids=prompt_ids,
            positions=positions[:, 0].float(),
            rope_delta=float(torch.as_tensor(delta).reshape(-1)[0]),
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
