"""The tiny checkpoint's answers end: the thinker after a sentence-final token, the talker two
frames after the text; `ignore_eos` still runs both to their limits (static frames included).
The talker never speaks the thinker's last token (`<|im_end|>` here; talker/prompt.py), also when
it learns that the token was the last only from a bare end marker."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.sampling import SamplingParams
from omnistream.engine.settings import TalkerEngineSettings, ThinkerEngineSettings, derive
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine, TalkerParams
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine, ThinkerParams
from omnistream.models.qwen3_omni.tiny import BPE_VOCAB
from omnistream.models.qwen3_omni.tiny_answer_end import sentence_final_ids

TEXT = list(range(5, 25))  # 20 plain BPE tokens as the thinker's answer (then its <|im_end|>)


@pytest.fixture(scope="module")
def thinker(ending_tiny_model_dir):
    options = LoadOptions(dtype="float32")
    engine = ThinkerEngine(
        ending_tiny_model_dir, derive(ThinkerEngineSettings, options, max_batch=4, max_model_len=512)
    )
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module", params=[False, True], ids=["eager-frames", "static-frames"])
def talker(ending_tiny_model_dir, request):
    engine = TalkerEngine(
        ending_tiny_model_dir,
        TalkerEngineSettings(dtype="float32", max_batch=4, max_model_len=512, static_frames=request.param),
    )
    engine.start()
    yield engine
    engine.stop()


def _collect(start) -> list:
    """Everything the stream `start()` opens yields (it needs the running loop)."""

    async def run() -> list:
        return [item async for item in start()]

    return asyncio.run(run())


def _answer(thinker, seed: int, **params) -> list:
    prompt = thinker.encode_chat([{"role": "user", "content": "What is the weather like today?"}])
    sampling = SamplingParams(temperature=1.0, seed=seed)
    params = ThinkerParams(max_tokens=256, sampling=sampling, **params)
    return _collect(lambda: thinker.add_request(f"t{seed}", prompt, params))


def test_thinker_ends_after_a_sentence_final_token(thinker):
    final = set(sentence_final_ids(thinker.tokenizer, BPE_VOCAB))
    lengths = []
    for seed in range(12):
        outputs = _answer(thinker, seed)
        ids = [t for o in outputs for t in o.token_ids]
        assert outputs[-1].finish_reason == "stop"
        assert ids[-1] == thinker.config.im_end_token_id
        if len(ids) > 1:
            assert ids[-2] in final  # the end comes right after the sentence ends
        assert not final & set(ids[:-2])  # and not before
        lengths.append(len(ids))
    assert statistics.mean(lengths) < 40, lengths  # ~14 expected; 256 when answers never end


def test_thinker_ignore_eos_runs_to_max_tokens(thinker):
    outputs = _answer(thinker, 0, ignore_eos=True)
    assert sum(len(o.token_ids) for o in outputs) == 256 and outputs[-1].finish_reason == "length"


def _speak(talker, thinker, rid: str, **params) -> list:
    prompt = thinker.encode_chat([{"role": "user", "content": "hello"}])

    def start():
        out = talker.add_request(rid, TalkerParams(max_frames=120, **params))
        talker.feed(rid, [*TEXT, thinker.config.im_end_token_id], last=True, prompt_ids=prompt)
        return out

    return _collect(start)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_talker_ends_two_frames_after_the_text(talker, thinker, temperature):
    sampling = SamplingParams(temperature=temperature, top_k=50, repetition_penalty=1.05, seed=3)
    outputs = _speak(talker, thinker, f"end-{temperature}", sampling=sampling)
    frames = [o for o in outputs if o.codes is not None]
    # The first frame comes from the prompt (holding the first text token), one frame per later
    # text token, one for tts_eos (in <|im_end|>'s place); at the first tts_pad row the talker
    # chooses EOS.
    assert len(frames) == len(TEXT) + 1
    assert outputs[-1].finished and outputs[-1].finish_reason == "stop"


def test_a_bare_end_marker_makes_the_last_token_the_end(talker, thinker):
    """Tokens that came without `last` wait for a later one before they are spoken: when the end
    comes alone, the last of them still takes tts_eos's place, so the frames are the ones of the
    same answer given with `last` at once."""
    prompt = thinker.encode_chat([{"role": "user", "content": "hello"}])
    answer = [*TEXT, thinker.config.im_end_token_id]
    whole = _collect(lambda: _start(talker, "whole", prompt, answer, last=True))

    async def split() -> tuple[list, list]:
        out = _start(talker, "split", prompt, answer, last=False)
        before = [await out.get() for _ in range(len(answer) - 1)]  # all that can be spoken yet
        with pytest.raises(TimeoutError):  # the last token's row waits: it may be the end
            await asyncio.wait_for(out.get(), 0.3)
        talker.feed("split", [], last=True)
        return before, [item async for item in out]

    before, after = asyncio.run(split())
    assert [o.codes for o in before + after] == [o.codes for o in whole]
    assert len([o for o in whole if o.codes is not None]) == len(TEXT) + 1
    assert after[-1].finish_reason == "stop"


def _start(talker, rid: str, prompt: list[int], answer: list[int], last: bool):
    out = talker.add_request(rid, TalkerParams(max_frames=120))
    talker.feed(rid, answer, last=last, prompt_ids=prompt)
    return out


def test_talker_ignore_eos_speaks_to_max_frames(talker, thinker):
    sampling = SamplingParams(temperature=0.9, seed=1)
    outputs = _speak(talker, thinker, "fixed", sampling=sampling, ignore_eos=True)
    assert len([o for o in outputs if o.codes is not None]) == 120
    assert outputs[-1].finish_reason == "length"
