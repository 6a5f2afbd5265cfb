"""The talker's prefix caching: a conversation's next turn prefills only its new user rows.

The talker's prompt is the user turns' rows (every user turn of the conversation, in order) then
nine assistant rows built from the answer's first tokens; a turn's user rows start with the
previous turn's, so their KV is what the previous turn computed. The assistant rows depend on the
answer and are never reused; the user rows' blocks are stored once the prompt's prefill has run.

A user row is a thinker token's text row, or at a multimodal position the projection of the
thinker's deep hidden row there, so a block's key (omnistream/engine/prefix_cache.py) is chained
over the rows' thinker ids with a salt of the block's M-RoPE positions and its deep rows (their
bytes: the content, not an id). The thinker's own prefix cache hands back
the very deep rows it computed before, so a spoken or shown turn is a hit in both stages.

The speaker is not in the key: it enters the assistant rows only.
"""

from __future__ import annotations

import bisect
import hashlib
import logging

import numpy as np
import torch

from omnistream.engine.kvcache import SlotKVCache
from omnistream.engine.prefix_cache import CachedBlock, PrefixCache
from omnistream.models.qwen3_omni.talker.state import _TalkerState

log = logging.getLogger(__name__)


class TalkerPrefixes:
    """The talker's use of its `PrefixCache` and `SlotKVCache` (engine thread only)."""

    def __init__(self, cache: PrefixCache, kv: SlotKVCache, multimodal_ids: set[int]) -> None:
        self.cache = cache
        self.kv = kv
        self.multimodal_ids = multimodal_ids

    def _salts(
        self, state: _TalkerState, users: list[int], tokens: list[int], positions: torch.Tensor | None
    ) -> _RowSalts:
        """What the user rows' blocks are salted with: each row's M-RoPE positions (plain ones
        without vision: a turn with an image keeps the positions of the rows before it, so its
        prefix is found from a turn without one) and at a multimodal position its deep row's bytes."""
        n = len(users)
        if positions is None:
            columns = np.repeat(np.arange(n, dtype=np.float64)[:, None], 3, axis=1)
        else:
            columns = positions[:, :n].to("cpu", torch.float64).T.contiguous().numpy()
        mm = [j for j, t in enumerate(tokens) if t in self.multimodal_ids]
        raw = None
        if mm and state.multimodal_hidden is not None:
            rows = state.multimodal_hidden.take([users[j] for j in mm]).detach().to("cpu")
            raw = rows.contiguous().view(torch.uint8).numpy()  # one device -> host copy for all rows
        return _RowSalts(columns, mm if raw is not None else [], raw)

    def plan_and_load(self, state: _TalkerState, users: list[int], positions: torch.Tensor | None) -> None:
        """At the prompt's first piece, its slot still empty: key its user rows (`users`: their
        prompt positions; `positions`: the prompt's [3, rows] M-RoPE positions, None without vision),
        load the longest cached prefix of them and start the prefill after it."""
        if not self.cache.enabled or state.slot is None:
            return
        prompt_ids = state.prompt_ids or []
        tokens = [prompt_ids[p] for p in users]
        salts = self._salts(state, users, tokens, positions)
        size, n, scope = self.cache.block_size, len(tokens), state.params.cache_scope
        block_salts = [salts.block(b * size, (b + 1) * size) for b in range(n // size)]
        keys = self.cache.digests(tokens, block_salts, scope)

        def tail(full: int, length: int) -> bytes:
            lo = full * size
            salt = salts.block(lo, lo + length)
            parent = keys[full - 1] if full else None
            return self.cache.tail_digest(parent, tokens[lo : lo + length], salt, scope)

        state.prefix_keys = keys
        state.prefix_tail = tail(len(keys), n % size) if n % size else None
        state.prefix_rows = n
        # Every user row may come from the cache: the assistant rows after them are always computed.
        blocks, reuse = self.cache.lookup(keys, n, tail)
        self.cache.count_query(n, reuse)
        if reuse:
            self.kv.load(state.slot, self.cache.kv_of(blocks, reuse))
            state.prefilled = state.cached_rows = reuse

    def store(self, state: _TalkerState) -> None:
        """Once the prompt is prefilled: keep its user rows' blocks (its last partial one too)."""
        keys, tail, n = state.prefix_keys, state.prefix_tail, state.prefix_rows
        state.prefix_keys, state.prefix_tail = [], None
        if not self.cache.enabled or state.slot is None or n == 0:
            return
        try:
            slot = state.slot

            def block_of(lo: int, hi: int) -> CachedBlock:
                return CachedBlock(self.kv.read(slot, lo, hi))

            self.cache.store_sequence(keys, tail, n, block_of, state.params.cache_scope)
        except Exception:  # the cache is an optimisation: a failure to store never fails the request
            log.exception("talker: storing the prompt of %s failed", state.request_id)


class _RowSalts:
    """The salt of any run of user rows [lo, hi): their positions ([n, 3] float64, `columns`) and
    the deep rows of the multimodal ones among them (`mm`: their row indexes, ascending; `raw`:
    their bytes, one row each), hashed as whole slices: a few calls a block, however many rows.
    Unambiguous: the positions take a fixed 24 bytes a row, each deep row its index and its fixed
    width."""

    def __init__(self, columns: np.ndarray, mm: list[int], raw: np.ndarray | None) -> None:
        self.columns = np.ascontiguousarray(columns, dtype=np.float64)
        self.mm = mm
        self.raw = raw

    def block(self, lo: int, hi: int) -> bytes:
        h = hashlib.sha256(self.columns[lo:hi].tobytes())
        a, b = bisect.bisect_left(self.mm, lo), bisect.bisect_left(self.mm, hi)
        if b > a and self.raw is not None:
            h.update(np.asarray(self.mm[a:b], dtype="<i8").tobytes())
            h.update(self.raw[a:b].tobytes())
        return h.digest()
