"""The thinker's batched model work: the text model's forward over the KV slots, each row's next
token (sampling, the output grammars' masks) and what a chosen token emits.

`ThinkerDecode` is `ThinkerEngine`'s base (engine.py): the engine schedules a step (encodes,
prefill pieces, a decode batch) and runs it through these; the prefill's pieces run through
`forward` too (prefill.py). The parts they use are the engine's, set in its constructor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from omnistream.engine.batch_sampler import BatchSampler, RowSampling
from omnistream.engine.engine import Engine, present
from omnistream.engine.grammar import BatchMask, MaskFill
from omnistream.engine.kvcache import SlotKVCache
from omnistream.engine.step_seeds import keyed
from omnistream.models.qwen3_omni.thinker.prefix import ThinkerPrefixes
from omnistream.models.qwen3_omni.thinker.state import _Step, _ThinkerState
from omnistream.models.qwen3_omni.thinker.text import ThinkerOutput
from omnistream.models.qwen3_omni.thinker.thinker_media import PromptEmbedding
from omnistream.request.errors import InternalError


class ThinkerDecode(Engine[_ThinkerState, _Step]):
    """The forward, the choice and the emission of the thinker's steps (see the module doc)."""

    # The engine's parts these run through (ThinkerEngine.__init__ sets them).
    thinker: Any  # the loaded thinker (its lm_head)
    lm: Any  # its text model
    cache: SlotKVCache
    sampler: BatchSampler
    grammar_mask: BatchMask
    prefixes: ThinkerPrefixes
    eos_ids: set[int]
    multimodal_ids: set[int]

    def forward(
        self,
        states: Sequence[_ThinkerState],
        ids: torch.Tensor | None,
        embedding: PromptEmbedding | None = None,
        positions: torch.Tensor | None = None,
        commit: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the text model on `ids` [B, q] (or a prompt embedding) at each row's own position;
        return last-position logits and the last hidden states. `commit=False`: the caller advances
        the lengths once the step's tokens are chosen (a batched step retried alone after a failed
        choice must find the lengths as they were)."""
        q = ids.shape[1] if ids is not None else present(embedding).embeds.shape[1]
        self.cache.plan([s.held_slot for s in states], q)
        if positions is None:
            positions = self.cache.positions()
            deltas = [s.rope_delta for s in states]
            if any(deltas):  # M-RoPE requests decode at sequence position + their delta
                offset = torch.tensor(deltas, dtype=torch.float32, device=positions.device).view(-1, 1)
                positions = positions.float() + offset
            positions = positions.unsqueeze(0).expand(3, -1, -1)
        extra: dict[str, Any] = {}
        if embedding is not None:
            inputs = embedding.embeds
            if embedding.deepstack is not None:
                extra = {
                    "visual_pos_masks": embedding.visual_mask,
                    "deepstack_visual_embeds": embedding.deepstack,
                }
        else:
            inputs = self.lm.embed_tokens(ids)
        out = self.lm(
            inputs_embeds=inputs,
            position_ids=positions,
            attention_mask=self.cache.attention_mask(),
            cache=self.cache,
            use_cache=True,
            **extra,
        )
        logits = self.thinker.lm_head(out.last_hidden_state[:, -1])
        if commit:  # last: a step that raised left the lengths as they were (retry-safe)
            self.cache.commit()
        return logits, out.last_hidden_state

    def _store_prompt(self, state: _ThinkerState) -> None:
        state.prompt_store_due = False
        self.prefixes.store(state, state.prompt_deep, answer=False)

    def _start_mask(self, states: Sequence[_ThinkerState]) -> MaskFill | None:
        """The grammar rows of a step's batch, filling in the mask's thread while the forward runs
        (None: no row has a grammar)."""
        constrained = [(row, s) for row, s in enumerate(states) if s.matcher is not None and not s.finished]
        if not constrained:
            return None
        return self.grammar_mask.start(
            [present(s.matcher) for _, s in constrained], [r for r, _ in constrained]
        )

    def choose(
        self,
        states: Sequence[_ThinkerState],
        logits: torch.Tensor,
        first: bool,
        filling: MaskFill | None = None,
    ) -> list[int]:
        """The next token of every row of the last forward ([B, V] logits), batched: one copy of the
        ids to the host per step. Like `generate`, the repetition penalty covers the prompt too: a
        request's presence mask starts from its prompt on its first token.

        Rows with a grammar choose only among the tokens it allows next: one bitmask for the batch,
        filled for those rows (`filling`: in the mask's thread while the forward ran; else here) and
        applied to their logits alone. A grammar that fails here fails its request only (its row's
        token is then dropped by `_accept`)."""
        if first:
            for state in states:
                if state.params.sampling.repetition_penalty != 1.0:
                    self.sampler.reset(state.held_slot, state.prompt_ids)
        constrained = [(row, s) for row, s in enumerate(states) if s.matcher is not None and not s.finished]
        if filling is not None:  # started before the forward: the rows that had a grammar then
            constrained = [(row, states[row]) for row in filling.rows]
        if constrained:
            masked = [row for row, _ in constrained]
            try:
                if filling is not None:
                    filling.wait()
                    self.grammar_mask.apply_filled(logits, filling)
                else:
                    self.grammar_mask.fill_rows([present(s.matcher) for _, s in constrained], masked)
                    self.grammar_mask.apply(logits, masked)
            except Exception:  # some row's grammar failed: row by row, each failure its request's alone
                masked = []
                for row, state in constrained:
                    with self.row(state):
                        self.grammar_mask.fill(present(state.matcher), row)
                        masked.append(row)
                self.grammar_mask.apply(logits, masked)
        # Each draw keyed by (seed, its token's index): a resumed answer draws the same.
        rows = [
            RowSampling(s.params.sampling, keyed(s.generator, s.seed, s.answered + len(s.generated)))
            for s in states
        ]
        return self.sampler.sample(logits, rows, self.cache.rows).tolist()

    def _accept(
        self, state: _ThinkerState, token: int, first: bool, hidden: torch.Tensor | None = None
    ) -> None:
        if state.finished:  # aborted while the step ran
            return
        state.generated.append(token)
        is_eos = token in self.eos_ids and not state.params.ignore_eos
        if state.matcher is not None:
            if not state.matcher.accept_token(token):
                raise InternalError(f"the output grammar refused token {token}, which its mask allowed")
            # Complete (its stop token taken): the answer ends here, even with ignore_eos.
            is_eos = is_eos or state.matcher.is_terminated()
        done_length = state.answered + len(state.generated) >= state.params.max_tokens
        finished = is_eos or done_length
        detok = present(state.detok)
        delta = detok.add(token)
        if finished:
            delta += detok.flush()
        if (delta and not state.text_out) or finished:
            state.text_out = True
            self.hand_off()
        state.next_token = token
        positions = layout = None
        if hidden is not None:  # the deep rows of the multimodal positions, in order
            assert state.media is not None
            positions = [i for i, t in enumerate(state.prompt_ids) if t in self.multimodal_ids]
            layout = state.media.layout
            state.media, state.embedding, state.deep_rows = None, None, []  # spent
        state.output.put(
            ThinkerOutput(
                token_ids=[token],
                text_delta=delta,
                index=state.answered + len(state.generated) - 1,
                finished=finished,
                finish_reason=("stop" if is_eos else "length") if finished else None,
                prompt_ids=list(state.prompt_ids) if first else None,
                cached_tokens=state.cached_tokens if first else 0,
                prompt_hidden=hidden,
                multimodal_positions=positions,
                media_layout=layout,
            )
        )
        # The prompt's blocks are stored once its second token is on its way too (a copy of its KV
        # that the client need not wait for: when the first token is no text yet, as a byte of an
        # unfinished character, the second is the first the client sees), at the latest when the
        # request ends, still on this thread before the slot can go: what the next turn finds is
        # all there. An answer that ends here stores the prompt's blocks with its own.
        if first and self.prefixes.enabled:
            state.prompt_deep = hidden
            state.prompt_store_due = not finished
        if finished:
            state.prompt_store_due = False
            self.prefixes.store(state, hidden if first else None, answer=True)
            self.finish(state)
