"""Thinker engine with media: sliced encoding, deep rows, validation, fault isolation, and how long
running requests wait while another request's audio is encoded."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine, ThinkerParams
from omnistream.models.qwen3_omni.thinker.thinker_media import encode_slices, plan_slices
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import AudioInput, ImageInput, VideoInput
from tests.media_reference import reference_inputs
from tests.media_samples import conversations, image, tone, video

TEXT = [{"role": "user", "content": "Tell me a story about the sea."}]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    # No prefix cache: these tests encode and prefill the same media again and count the steps.
    e = ThinkerEngine(
        tiny_model_dir,
        ThinkerEngineSettings(dtype="float64", max_batch=8, max_model_len=8192, prefix_cache_gib=0),
    )
    e.start()
    yield e
    e.stop()


def _user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


async def _collect(engine, rid, prompt_ids, params, media=None):
    out = engine.add_request(rid, prompt_ids, params, media=media)
    return [s async for s in out]


def test_sliced_encoding_equals_one_pass(engine):
    """Audio cut at attention windows and video cut at temporal patches give the whole pass's rows."""
    msgs = _user(
        {"type": "audio", "audio": tone(5.3)}, {"type": "video", "video": video(6, 16, audio_seconds=None)}
    )
    media = engine.prepare_media(msgs)
    model = engine.thinker.model
    merge = engine.config.thinker_config.vision_config.spatial_merge_size
    whole = encode_slices(model, plan_slices(media, 10**9, 10**9, merge))
    pieces = plan_slices(media, engine.audio_window, 16, merge)
    assert len(pieces) > len(whole) == 2
    sliced = encode_slices(model, pieces)
    audio = torch.cat([rows for p, (rows, _) in zip(pieces, sliced, strict=True) if p.kind == "audio"])
    torch.testing.assert_close(audio, whole[0][0], rtol=0, atol=1e-12)
    vids = [(rows, deep) for p, (rows, deep) in zip(pieces, sliced, strict=True) if p.kind == "video"]
    torch.testing.assert_close(torch.cat([r for r, _ in vids]), whole[1][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat([d[0] for _, d in vids]), whole[1][1][0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("layer", [1, 2])
def test_deep_rows_are_the_references_hidden_states(tiny_model_dir, engine, layer):
    """prompt_hidden = the reference thinker's hidden_states[layer] at the multimodal positions
    (layer 1 is the first decoder layer's output: before its deepstack addition)."""
    messages, aiv = conversations()["mixed_turns"]
    media = engine.prepare_media(messages, aiv)
    engine.accept_layer = layer
    try:
        steps = asyncio.run(
            _collect(engine, f"deep-{layer}", media.prompt_ids, ThinkerParams(1, True), media)
        )
    finally:
        engine.accept_layer = engine.config.talker_config.accept_hidden_layer
    first = steps[0]
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        tiny_model_dir, dtype=torch.float64, experts_implementation="eager"
    ).thinker.eval()
    inputs = reference_inputs(engine.processor, messages, aiv)
    assert inputs["input_ids"][0].tolist() == media.prompt_ids
    with torch.no_grad():
        hidden = model(**inputs, use_audio_in_video=aiv, output_hidden_states=True).hidden_states[layer]
    positions = first.multimodal_positions
    assert positions == [i for i, t in enumerate(media.prompt_ids) if t in engine.multimodal_ids]
    torch.testing.assert_close(first.prompt_hidden, hidden[0, positions], rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("messages", "aiv", "says"),
    [
        (
            _user({"type": "audio", "audio": AudioInput(np.zeros(800, np.float32), 8000)}),
            False,
            "sample_rate",
        ),
        (_user({"type": "audio", "audio": AudioInput(np.zeros(800, np.float64))}), False, "float32"),
        (_user({"type": "audio", "audio": AudioInput(np.full(800, np.nan, np.float32))}), False, "NaN"),
        (_user({"type": "image", "image": ImageInput(np.zeros((16, 16, 3), np.float32))}), False, "uint8"),
        (_user({"type": "image", "image": ImageInput(np.zeros((16, 16), np.uint8))}), False, "uint8"),
        (
            _user({"type": "video", "video": VideoInput(np.zeros((2, 12, 16, 3), np.uint8), 2.0)}),
            False,
            "multiples",
        ),
        (_user({"type": "video", "video": video(audio_seconds=None)}), True, "no audio"),
        (
            _user({"type": "video", "video": video()}, {"type": "video", "video": video(fps=1.0)}),
            False,
            "fps",
        ),
        (_user({"type": "sound", "sound": 1}), False, "type"),
    ],
)
def test_bad_media_is_refused_naming_it(engine, messages, aiv, says):
    with pytest.raises(InvalidRequest) as err:
        engine.prepare_media(messages, aiv)
    assert says in str(err.value) and err.value.field == "messages"


def test_media_prompt_must_match_its_ids(engine):
    media = engine.prepare_media(_user({"type": "image", "image": image()}))

    async def run():
        with pytest.raises(InvalidRequest):
            engine.add_request("mismatch", media.prompt_ids[:-1], ThinkerParams(2), media=media)
        with pytest.raises(InvalidRequest):  # placeholders without media
            engine.add_request("no-media", media.prompt_ids, ThinkerParams(2))

    asyncio.run(run())
    assert engine.num_requests == 0


def test_a_failing_encode_fails_only_its_request(tiny_model_dir):
    engine = ThinkerEngine(
        tiny_model_dir, ThinkerEngineSettings(dtype="float64", max_batch=8, max_model_len=1024)
    )
    params = ThinkerParams(8, True)
    text_ids = engine.encode_chat(TEXT)
    good = engine.prepare_media(_user({"type": "image", "image": image()}))
    poison = engine.prepare_media(_user({"type": "image", "image": image(24, 24, seed=5)}))
    visual = engine.thinker.model.visual
    forward = visual.forward

    def faulty(pixels, grid_thw, **kw):
        if any(g.tolist() == [1, 6, 6] for g in grid_thw):  # the 24x24 image
            raise RuntimeError("injected encoder fault")
        return forward(pixels, grid_thw=grid_thw, **kw)

    engine.start()
    try:
        solo_good = asyncio.run(_collect(engine, "solo", good.prompt_ids, params, good))
        solo_text = asyncio.run(_collect(engine, "solo-text", text_ids, params))
        visual.forward = faulty

        async def together():
            async def run(rid, ids, media):
                try:
                    return await _collect(engine, rid, ids, params, media)
                except Exception as exc:
                    return exc

            return await asyncio.gather(
                run("good", good.prompt_ids, good),
                run("poison", poison.prompt_ids, poison),
                run("text", text_ids, None),
            )

        good_out, poison_out, text_out = asyncio.run(together())
    finally:
        visual.forward = forward
        engine.stop()
    assert isinstance(poison_out, Exception) and "injected" in str(poison_out)
    tokens = lambda steps: [t for s in steps for t in s.token_ids]  # noqa: E731
    assert tokens(good_out) == tokens(solo_good)
    assert tokens(text_out) == tokens(solo_text)
    assert engine.num_requests == 0


def _media_phase(engine, media, budget: int, chunk: int) -> dict[str, float]:
    """Steps while `media`'s request encodes and prefills, next to a running text request: the
    longest encode and prefill steps, the longest gap between the text request's tokens."""
    engine.encode_budget, engine.prefill_chunk = budget, chunk
    text_ids = engine.encode_chat(TEXT)
    steps: list[tuple[int, int, float]] = []  # (slices, prefills, seconds)
    run_step = engine.run_step

    def timed(work):
        started = time.perf_counter()
        try:
            run_step(work)
        finally:
            steps.append((len(work.encode), len(work.prefill), time.perf_counter() - started))

    async def run():
        out = engine.add_request(f"itl-{budget}", text_ids, ThinkerParams(4000, True))
        for _ in range(5):  # the text request is decoding steadily
            await out.get()
        engine.run_step = timed
        media_out = engine.add_request(f"enc-{budget}", media.prompt_ids, ThinkerParams(1, True), media=media)
        first = asyncio.ensure_future(media_out.get())
        times = [time.perf_counter()]
        while not first.done():
            await out.get()
            times.append(time.perf_counter())
        await out.get()  # the running request's token of the step that ended the prefill
        times.append(time.perf_counter())
        while not any(p for _, p, _ in steps):  # that step is recorded once it has returned
            await asyncio.sleep(0.01)
        del engine.run_step  # back to the class's
        engine.abort(f"itl-{budget}")
        await first
        return {
            "encode_steps": sum(1 for n, _, _ in steps if n),
            "max_encode_step": max(t for n, _, t in steps if n),
            "prefill_steps": sum(1 for _, p, _ in steps if p),
            "max_prefill_step": max(t for _, p, t in steps if p),
            "max_gap": float(np.diff(times).max()),
        }

    return asyncio.run(run())


def test_running_requests_keep_decoding_while_audio_encodes(engine):
    """A long audio is encoded one attention window per step and its prompt prefilled one chunk per
    step, so a running request gets a token after every slice or chunk instead of waiting for the
    whole encode and prefill. Prints the numbers (run with -s)."""
    window = engine.audio_window
    media = engine.prepare_media(_user({"type": "audio", "audio": tone(300.0)}))
    frames, tokens = media.audio_frames, len(media.prompt_ids)
    sliced = _media_phase(engine, media, window, 256)
    whole = _media_phase(engine, media, 10**9, 10**9)
    engine.encode_budget, engine.prefill_chunk = 4 * window, 512
    for name, m in (("1 window / 256-token chunks", sliced), ("unbudgeted", whole)):
        print(
            f"\n300 s audio ({frames} frames, {tokens} prompt tokens) next to a decoding request, {name}: "
            f"{m['encode_steps']} encode steps (longest {m['max_encode_step'] * 1e3:.1f} ms), "
            f"{m['prefill_steps']} prefill steps (longest {m['max_prefill_step'] * 1e3:.1f} ms); longest gap "
            f"between the running request's tokens {m['max_gap'] * 1e3:.1f} ms"
        )
    assert sliced["encode_steps"] >= frames // window and whole["encode_steps"] == 1
    assert sliced["prefill_steps"] >= tokens // 256 and whole["prefill_steps"] == 1
    assert sliced["max_gap"] * 2 < whole["max_gap"]  # no step held the running request for all of it


def test_special_token_strings_in_text_parts_stay_text(engine):
    """A user typing placeholders next to real media gets no extra media slots: only the template's
    placeholders are expanded, the typed ones are the ordinary tokens of their characters."""
    typed = "<|image_pad|><|audio_start|><|audio_pad|>"
    media = engine.prepare_media(_user({"type": "image", "image": image()}, {"type": "text", "text": typed}))
    plain = engine.prepare_media(_user({"type": "image", "image": image()}, {"type": "text", "text": "x"}))
    tc = engine.config.thinker_config
    for token in (tc.image_token_id, tc.audio_token_id, tc.audio_start_token_id):
        assert media.prompt_ids.count(token) == plain.prompt_ids.count(token)
    assert typed in engine.tokenizer.decode(media.prompt_ids)


def test_ids_and_placeholders_that_do_not_fit_are_refused_before_any_batch(engine):
    """The prompt checks of add_request (text.check_ids, thinker_media.check_media_prompt), which
    count a whole conversation's ids at every turn."""
    from omnistream.models.qwen3_omni.thinker.thinker_media import check_media_prompt

    text = engine.text
    for ids, message in (([], "empty"), ([5, -1], r"\[0, "), ([5, engine.vocab_size], r"\[0, ")):
        with pytest.raises(InvalidRequest, match=message):
            text.check_ids(ids)
    audio_id = engine.config.thinker_config.audio_token_id
    with pytest.raises(InvalidRequest, match="no media"):
        text.check_ids([5, audio_id])
    messages = [{"role": "user", "content": [{"type": "audio", "audio": tone(1.0)}]}]
    media = engine.prepare_media(messages)
    check_media_prompt(media, media.prompt_ids, engine.config)
    check_media_prompt(media, tuple(media.prompt_ids), engine.config)  # any sequence
    fewer = list(media.prompt_ids)
    fewer[fewer.index(audio_id)] = 5
    with pytest.raises(InvalidRequest, match="audio placeholders"):
        check_media_prompt(media, fewer, engine.config)
