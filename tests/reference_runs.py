"""The transformers reference for text prompts on every tiny build, and the cases compared with it.

`Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)`, greedy, float64, run once per
build and case in a session: the pipeline, the stage services and the gateway tests compare their
tokens, codes and audio against the same runs.

The builds differ where an answer's end can hide a difference (issue 34: one codec frame too many
that the never-ending build could not show, since its answers stop at `max_audio_frames` and its
talker barely listens to its text rows):
- "never-ending": seed 0, `answers_end=False`: every answer runs to its limits;
- "ending": seed 0, the default build (`make run`): the thinker ends after a sentence-final token,
  the talker at the first tts_pad row;
- "seed7-h96": another seed and size (hidden 96), ending;
- "real-shaped": the real code predictor's depth (5 layers) and experts' routing (128 experts, 8 active a
  thinker token, 6 a talker row), ending (omnistream/bench/op_counts.py).

The cases end every way there is: by the thinker's own end token and by `max_tokens` (the thinker),
by the talker's end code and by `max_audio_frames` (the talker), with the talker's repetition
penalty off and at the reference's default (1.05). `test_pipeline.py` checks that the ending
builds' reference runs do cover each way, so a case cannot quietly stop testing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

BUILDS = ("never-ending", "ending", "seed7-h96", "real-shaped")
# (mode, chunk schedule): every way a request's audio may be cut into chunks and handed on.
RUNS = (("async", "grow"), ("async", "fixed"), ("sequential", "grow"), ("sequential", "fixed"))
# The second seed and size: a build whose random weights share nothing with seed 0's.
OTHER_BUILD = {"seed": 7, "hidden_size": 96}


@dataclass(frozen=True)
class Case:
    """One request as the reference tests send it (greedy text and voice)."""

    messages: list[dict[str, Any]]
    max_tokens: int = 20
    max_frames: int = 24  # above any ending answer's frames (<= max_tokens), so EOS ends those
    talker_repetition_penalty: float = 1.0

    def options(self) -> dict[str, Any]:
        """The request as the clients' keyword arguments (gRPC and REST alike)."""
        return {
            "max_tokens": self.max_tokens,
            "max_audio_frames": self.max_frames,
            "temperature": 0.0,
            "talker_temperature": 0.0,
            "talker_repetition_penalty": self.talker_repetition_penalty,
            "initial_codec_chunk_frames": 4,
        }

    def request(self, mode: str = "async", schedule: str = "grow"):
        """The request as a `GenerationRequest` (the pipeline's and the stage tests' input)."""
        from omnistream.pipeline import GenerationRequest
        from omnistream.request.sampling_params import SamplingParams

        return GenerationRequest(
            messages=self.messages,
            max_tokens=self.max_tokens,
            max_audio_frames=self.max_frames,
            talker_sampling=SamplingParams(repetition_penalty=self.talker_repetition_penalty),
            initial_codec_chunk_frames=4,
            codec_chunk_schedule=schedule,
            mode=mode,
        )


def runs_for(build: str, case: str, outer: bool = False) -> tuple[tuple[str, str], ...]:
    """The (mode, schedule) runs of one case: all four, except where a case costs most for what it
    adds (the never-ending build, whose answers all run to the limits; `outer`: a layer above the
    ones that run all four): two, turning with the case, so the cases cover all four together."""
    if build != "never-ending" and not outer:
        return RUNS
    i = list(CASES).index(case)
    return RUNS[i % len(RUNS)], RUNS[(i + 1) % len(RUNS)]


CASES = {
    "english": Case([{"role": "user", "content": "Hello, how are you today?"}]),
    "german-emoji": Case(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Wie geht es dir heute? Gr\u00fc\u00dfe \U0001f600"},
        ],
        talker_repetition_penalty=1.05,
    ),
    "digits": Case([{"role": "user", "content": "1234 5678 90, then 42?"}]),
    "multi-turn": Case(  # the talker hears the user turns only
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the weather like?"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "caf\u00e9 na\u00efve \u4f60\u597d, and tomorrow?"},
        ]
    ),
    "text-cut-short": Case([{"role": "user", "content": "Tell me a story about the sea."}], max_tokens=3),
    "speech-cut-short": Case([{"role": "user", "content": "Tell me a story about the sea."}], max_frames=3),
}


@dataclass(frozen=True)
class ReferenceRun:
    tokens: list[int]  # generated, the thinker's end token included when it ended by itself
    codes: np.ndarray  # [16, frames] int64
    wav: np.ndarray  # float32 samples

    @property
    def frames(self) -> int:
        return int(self.codes.shape[1])


class Reference:
    """`generate` on one checkpoint, each (prompt, case) run once."""

    def __init__(self, model_dir: str) -> None:
        from transformers import Qwen3OmniMoeForConditionalGeneration

        self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
            model_dir, dtype=torch.float64, experts_implementation="eager"
        ).eval()
        self._runs: dict[tuple, ReferenceRun] = {}

    def run(self, prompt_ids: list[int], case: Case) -> ReferenceRun:
        key = (tuple(prompt_ids), case.max_tokens, case.max_frames, case.talker_repetition_penalty)
        if key not in self._runs:
            self._runs[key] = self._generate(prompt_ids, case)
        return self._runs[key]

    def _generate(self, prompt_ids: list[int], case: Case) -> ReferenceRun:
        sequences, wav, codes = generate_greedy(
            self.model,
            case.max_tokens,
            case.max_frames,
            case.talker_repetition_penalty,
            input_ids=torch.tensor([prompt_ids]),
        )
        return ReferenceRun(sequences[0, len(prompt_ids) :].tolist(), codes, wav.reshape(-1).numpy())


def generate_greedy(
    model, max_tokens: int, max_frames: int, talker_repetition_penalty: float = 1.0, **inputs: Any
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """`generate(return_audio=True)` greedy on both ends: (sequences, wav, codes [16, frames]), the
    codes as Code2Wav was given them."""
    captured: list[torch.Tensor] = []
    decode = model.code2wav.chunked_decode

    def capture(codes, *args, **kwargs):
        captured.append(codes.clone())
        return decode(codes, *args, **kwargs)

    model.code2wav.chunked_decode = capture
    try:
        with torch.no_grad():
            sequences, wav = model.generate(
                **inputs,
                return_audio=True,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_repetition_penalty=talker_repetition_penalty,
                thinker_max_new_tokens=max_tokens,
                # max_audio_frames N is talker_max_new_tokens N + 1: the reference drops its last
                # codebook-0 step when it stops by length.
                talker_max_new_tokens=max_frames + 1,
                thinker_eos_token_id=model.config.im_end_token_id,
            )
    finally:
        model.code2wav.chunked_decode = decode
    return sequences, wav, captured[0][0].numpy()


def chat_prompt_ids(model_dir: str, messages: list[dict[str, Any]]) -> list[int]:
    """The reference's own encoding of a chat: the prompt a client sending `messages` asks for."""
    from omnistream.models.qwen3_omni.checkpoint import load_tokenizer

    ids = load_tokenizer(model_dir).apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
