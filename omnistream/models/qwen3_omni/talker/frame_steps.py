"""One talker frame: the talker forward and codebook 0, then the code predictor's codebooks 1..15.

`FrameSteps` is a part `TalkerEngine` holds. Two paths give the same codes: the eager one
(`talker_forward`, `take_code0`, `predict_residuals`) and, with static frames, two fixed-shape
capturable steps (`predict_static`, `decode_static`, through `frame.StaticTalkerFrame`). Its inputs
are the modules, cache and samplers it runs, and the engine's request bookkeeping (`RequestBook`:
a row's failure is that request's, a finished request leaves), each named in the constructor.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from omnistream.engine.batch_sampler import BatchSampler, RowSampling
from omnistream.engine.engine import present
from omnistream.engine.kvcache import SlotKVCache
from omnistream.engine.sampling import SamplingParams
from omnistream.engine.stats import EngineStats
from omnistream.engine.step_seeds import keyed
from omnistream.models.qwen3_omni.talker.code_predictor import CodePredictorRunner
from omnistream.models.qwen3_omni.talker.eos import EosMask
from omnistream.models.qwen3_omni.talker.frame import StaticTalkerFrame
from omnistream.models.qwen3_omni.talker.prompt import (
    ASSISTANT_PROMPT_TOKENS,
    TalkerPromptBuilder,
    trailing_pick,
)
from omnistream.models.qwen3_omni.talker.state import TalkerOutput, _TalkerState

# The reference's code predictor samples with these whenever the talker samples.
CODE_PREDICTOR_TOP_K = 50
CODE_PREDICTOR_TOP_P = 0.8
CODE_PREDICTOR_SAMPLING = SamplingParams(
    temperature=1.0, top_k=CODE_PREDICTOR_TOP_K, top_p=CODE_PREDICTOR_TOP_P
)


class RequestBook(Protocol):
    """What the frame steps need of the engine's request bookkeeping (`Engine` offers it)."""

    stats: EngineStats

    def row(self, state: _TalkerState) -> AbstractContextManager[None]:
        """Per-request work after a batched forward: a failure there fails that request alone."""
        ...

    def finish(self, state: _TalkerState) -> None:
        """The request's terminal output is queued: it leaves the engine."""
        ...


class TalkerModel(Protocol):
    """The parts of the talker module a frame calls (transformers' Qwen3-Omni talker)."""

    model: Callable[..., Any]  # the decoder stack: returns an output with `last_hidden_state`
    codec_head: Callable[[torch.Tensor], torch.Tensor]

    def get_input_embeddings(self) -> Callable[[torch.Tensor], torch.Tensor]: ...


class FrameSteps:
    """The frame steps of the talker: each takes the requests of one step and emits or finishes them."""

    def __init__(
        self,
        *,
        requests: RequestBook,
        talker: TalkerModel,
        cp_embeddings: Sequence[Callable[[torch.Tensor], torch.Tensor]],
        code_predictor: CodePredictorRunner,
        frame: StaticTalkerFrame | None,
        prompts: TalkerPromptBuilder,
        cache: SlotKVCache,
        sampler: BatchSampler,
        cp_sampler: BatchSampler,
        eos_mask: EosMask,
        device: str | torch.device,
        codec_eos: int,
        num_groups: int,
        frame_seconds: float,
    ) -> None:
        self.requests = requests
        self.talker = talker
        self.cp_embeddings = cp_embeddings  # the code predictor's input embeddings, one per group
        self.code_predictor = code_predictor
        self.frame = frame  # static frames (two capturable steps), or None for the eager frame
        self.prompts = prompts
        self.cache = cache
        self.sampler = sampler
        self.cp_sampler = cp_sampler
        self.eos_mask = eos_mask
        self.device = device
        self.codec_eos = codec_eos
        self.num_groups = num_groups
        self.frame_seconds = frame_seconds  # audio seconds one codec frame holds: the playout's unit

    def talker_forward(
        self,
        states: list[_TalkerState],
        embeds: torch.Tensor,
        positions: torch.Tensor | None = None,
        commit: bool = True,
    ) -> torch.Tensor:
        """Talker model on [B, q, H] rows; returns the last position's normed hidden [B, 1, H].
        `commit=False`: the caller advances the lengths once codebook 0 is chosen (a batched step
        retried alone after a failed choice must find the lengths as they were)."""
        self.cache.plan([s.held_slot for s in states], embeds.shape[1])
        if positions is None:
            positions = self.cache.positions()
            deltas = [s.rope_delta for s in states]
            if any(deltas):  # prompts with vision decode at sequence position + their delta
                offset = torch.tensor(deltas, dtype=torch.float32, device=positions.device).view(-1, 1)
                positions = positions.float() + offset
            positions = positions.unsqueeze(0).expand(3, -1, -1)
        out = self.talker.model(
            inputs_embeds=embeds,
            position_ids=positions,
            attention_mask=self.cache.attention_mask(),
            cache=self.cache,
            use_cache=True,
        )
        if commit:
            self.cache.commit()
        hidden: torch.Tensor = out.last_hidden_state[:, -1:]
        return hidden

    def take_code0(
        self, states: list[_TalkerState], hidden: torch.Tensor, first: bool = False, commit: bool = False
    ) -> None:
        """Codebook 0 of every row of the last talker forward, chosen in one batch (one copy of the
        ids to the host). The penalty covers the request's codebook-0 history, kept as its slot's
        presence mask, which its first frame starts afresh."""
        logits = self.eos_mask.apply(self.talker.codec_head(hidden[:, -1]), self.cache.rows)
        if first:
            for state in states:
                if state.params.sampling.repetition_penalty != 1.0:
                    self.sampler.reset(state.held_slot)
        codes = self.sampler.sample(logits, code0_rows(states), self.cache.rows).tolist()
        if commit:  # the forward's lengths advance only once its codes are chosen
            self.cache.commit()
        for row, (state, code0) in enumerate(zip(states, codes, strict=True)):
            if not state.finished:
                with self.requests.row(state):
                    self.accept_code0(state, code0, hidden[row : row + 1])

    def accept_code0(self, state: _TalkerState, code0: int, hidden: torch.Tensor | None) -> None:
        if code0 == self.codec_eos:
            state.output.put(TalkerOutput(None, state.frames, finished=True, finish_reason="stop"))
            self.requests.finish(state)
            return
        state.pending_code0 = code0
        if self.frame is not None:  # static frames: the slot's buffer, where the next step reads it
            if hidden is not None:
                self.frame.store_hidden(state.held_slot, hidden)
        else:
            state.past_hidden = hidden

    def next_picks(self, states: list[_TalkerState]) -> list[int]:
        """Each row's next trailing text id: its assistant-stream token, or tts_eos / tts_pad (the
        thinker's last token is tts_eos's place: omnistream/models/qwen3_omni/talker/prompt.py)."""
        picks = []
        for state in states:
            index = ASSISTANT_PROMPT_TOKENS + state.frames - 1  # assistant-stream index of the row
            pick = trailing_pick(state.stream, state.input_done, index)
            assert pick is not None, "a frame step ran before its text row was known"
            picks.append(pick)
        return picks

    def cp_rows(self, states: list[_TalkerState]) -> list[RowSampling]:
        # The reference's code predictor samples with fixed knobs whenever the talker samples; its
        # residuals' draws are the frame's stream 1 (codebook 0's is stream 0: `code0_rows`).
        return [
            RowSampling(
                SamplingParams() if s.params.sampling.greedy else CODE_PREDICTOR_SAMPLING,
                keyed(s.cp_generator, s.seed, s.frames, stream=1),
            )
            for s in states
        ]

    def predict_static(self, states: list[_TalkerState]) -> None:
        """`predict_residuals` as one capturable step (static frames)."""
        assert self.frame is not None
        slots = [s.held_slot for s in states]
        code0 = [present(s.pending_code0) for s in states]
        frames = self.frame.predict(slots, code0, self.cp_rows(states))
        for state, frame in zip(states, frames, strict=True):
            with self.requests.row(state):
                self.emit_frame(state, frame, None)

    def decode_static(self, states: list[_TalkerState]) -> None:
        """The talker forward and codebook 0 as one capturable step (static frames)."""
        assert self.frame is not None
        codes = self.frame.decode(
            [s.held_slot for s in states],
            self.next_picks(states),
            [s.rope_delta for s in states],
            code0_rows(states),
        )
        for state, code0 in zip(states, codes, strict=True):
            if not state.finished:
                with self.requests.row(state):
                    self.accept_code0(state, code0, None)

    def next_inputs(self, states: list[_TalkerState]) -> torch.Tensor:
        """[B, 1, H]: each row's codec sum of its last frame + its next trailing text row (or
        tts_eos / tts_pad), the text rows of the whole step in one embed + projection."""
        codec = torch.cat([present(s.next_codec_sum) for s in states], dim=0)
        return codec + self.prompts.trailing_rows(self.next_picks(states))

    def predict_residuals(self, states: list[_TalkerState]) -> None:
        """Codebooks 1..15 for each state's pending codebook 0, batched; emits the frames."""
        device = self.device
        code0 = torch.tensor([[s.pending_code0] for s in states], dtype=torch.long, device=device)
        code0_embed = self.talker.get_input_embeddings()(code0)  # [B, 1, H]
        past = torch.cat([present(s.past_hidden) for s in states], dim=0)
        embeds = torch.cat((past, code0_embed), dim=1)
        codes = [code0[:, 0]]
        hiddens = [code0_embed]
        embedding = self.cp_embeddings
        # The ids stay on the device until the frame is done (one copy to the host per frame).
        knobs = self.cp_sampler.prepare(self.cp_rows(states))
        for group in range(self.num_groups - 1):
            logits = self.code_predictor.run(group, embeds)
            ids = self.cp_sampler.sample(logits, knobs)
            codes.append(ids)
            embeds = embedding[group](ids.view(-1, 1))
            hiddens.append(embeds)
        codec_sum = torch.cat(hiddens, dim=1).sum(1, keepdim=True)
        frames = torch.stack(codes, dim=1).tolist()  # [B, 16]
        for row, state in enumerate(states):
            with self.requests.row(state):
                self.emit_frame(state, frames[row], codec_sum[row : row + 1])

    def emit_frame(self, state: _TalkerState, frame: list[int], codec_sum: torch.Tensor | None) -> None:
        state.pending_code0 = None
        state.past_hidden = None
        state.next_codec_sum = codec_sum
        state.frames += 1
        state.playout.emitted(self.frame_seconds, time.monotonic())
        # The stage's measured speed counts frames (omnistream/service/speed.py).
        self.requests.stats.last_units += 1
        done = state.frames >= state.params.max_frames
        state.output.put(
            TalkerOutput(frame, state.frames - 1, finished=done, finish_reason="length" if done else None)
        )
        if done:
            self.requests.finish(state)


def code0_rows(states: list[_TalkerState]) -> list[RowSampling]:
    """Each row's codebook-0 draw, its generator seeded for the frame it chooses (step_seeds.py): a
    talker regenerating a request elsewhere draws each frame as the first one did."""
    return [RowSampling(s.params.sampling, keyed(s.generator, s.seed, s.frames)) for s in states]
