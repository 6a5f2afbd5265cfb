"""The thinker's prefix caching: what a prompt's blocks are keyed by, reuse at its first prefill,
and what is stored of it and of its answer (omnistream/engine/prefix_cache.py keeps the blocks).

A block's KV depends on its tokens, on everything before it (the chain), on its M-RoPE positions
(the positions of text after a video depend on the video) and on the content of the media items
whose placeholders it holds; its salt is those positions and the digests of those items. Besides
the KV a block keeps the deep rows of its multimodal positions (`accept_hidden_layer`): the talker
reads them and a reused prefix does not compute them again.

Media in a reused prefix is not encoded again: the reused length is cut back to the start of any
media item it would cut through, the slices of the items wholly inside it are dropped before the
encode phase, and the prompt's embedding starts where the reuse ends. A reuse leaves at least the
prompt's last position to compute (its logits choose the first token).

The prompt's blocks are stored once its prefill has run (after its second token, or when it ends),
the answer's when it ends by itself or by length: an aborted or failed request stores nothing of
its answer.
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import torch

from omnistream.engine.kvcache import SlotKVCache
from omnistream.engine.prefix_cache import CachedBlock, PrefixCache
from omnistream.models.qwen3_omni.thinker.media_item import media_items
from omnistream.models.qwen3_omni.thinker.state import _ThinkerState

log = logging.getLogger(__name__)


class ThinkerPrefixes:
    """The thinker's use of its `PrefixCache` and `SlotKVCache` (engine thread only)."""

    def __init__(self, cache: PrefixCache, kv: SlotKVCache, multimodal_ids: set[int], config: object) -> None:
        self.cache = cache
        self.kv = kv
        self.multimodal_ids = multimodal_ids
        self._multimodal_array = np.fromiter(multimodal_ids, dtype=np.int64, count=len(multimodal_ids))
        self.config = config

    @property
    def enabled(self) -> bool:
        return self.cache.enabled

    # --- keys ---------------------------------------------------------------------------------------
    def _positions(self, state: _ThinkerState, end: int) -> torch.Tensor:
        """[3, end] M-RoPE positions of the request's first `end` sequence positions (prompt, then
        its answer at sequence position + rope delta), float64."""
        plen = len(state.prompt_ids)
        prompt = state.prompt_positions
        if prompt is None:
            return torch.arange(end, dtype=torch.float64).expand(3, -1)
        if end <= plen:
            return prompt[:, :end]
        after = torch.arange(plen, end, dtype=torch.float64) + state.rope_delta
        return torch.cat([prompt, after.expand(3, -1)], dim=1)

    def _salt(self, state: _ThinkerState, positions: torch.Tensor, lo: int, hi: int) -> bytes:
        """What positions [lo, hi) depend on besides their tokens: their M-RoPE positions where
        they are not their sequence indexes (those the chain already holds: a text block keys the
        same before and after media join the conversation), and the content of the media items
        with placeholders among them."""
        items = [item.digest for item in state.items if item.first < hi and item.last >= lo]
        block = positions[:, lo:hi].numpy()  # numpy: a block's few compares cost no torch dispatch
        plain = state.prompt_positions is None or bool((block == np.arange(lo, hi)).all())
        return _salt_of(block, plain, items)

    def _salts(self, state: _ThinkerState, positions: torch.Tensor, first: int, blocks: int) -> list[bytes]:
        """`_salt` of full blocks [first, blocks), for all of them at once: the positions compared
        in one operation and each item listed in the blocks it spans, so a long conversation's
        keys cost a few microseconds a block (per block, they took ~1 ms at 1,800 positions)."""
        size = self.cache.block_size
        lo, hi = first * size, blocks * size
        grid = positions[:, lo:hi].numpy()
        if state.prompt_positions is None:
            plain = [True] * (blocks - first)
        else:
            plain = (grid == np.arange(lo, hi)).reshape(3, -1, size).all(axis=(0, 2)).tolist()
        spanned: list[list[bytes]] = [[] for _ in range(blocks - first)]
        for item in state.items:  # in prompt order, so each block's digests are too
            for b in range(max(item.first // size, first), min(item.last // size + 1, blocks)):
                spanned[b - first].append(item.digest)
        blocks_of = zip(grid.reshape(3, -1, size).transpose(1, 0, 2), plain, spanned, strict=True)
        return [_salt_of(block, flat, items) for block, flat, items in blocks_of]

    def keys(self, state: _ThinkerState, tokens: list[int], known: list[bytes] | None = None) -> list[bytes]:
        """The chained keys of the full blocks of `tokens` (the request's sequence, from 0);
        `known`: the keys of its first blocks, already computed (the chain goes on from them)."""
        size = self.cache.block_size
        blocks = len(tokens) // size
        known = list(known or [])[:blocks]
        if state.prompt_positions is None and not state.items and state.rope_delta == 0:
            salts: list[bytes] | None = None  # plain text: no block has a salt
        else:
            salts = self._salts(state, self._positions(state, blocks * size), len(known), blocks)
        parent = known[-1] if known else None
        rest = self.cache.digests(tokens[len(known) * size :], salts, state.params.cache_scope, parent)
        return known + rest

    def tail_key(
        self, state: _ThinkerState, tokens: list[int], keys: list[bytes], full: int, length: int
    ) -> bytes:
        """The key of the partial block of `length` positions after the first `full` blocks."""
        lo = full * self.cache.block_size
        positions = self._positions(state, lo + length)
        parent = keys[full - 1] if full else None
        salt = self._salt(state, positions, lo, lo + length)
        return self.cache.tail_digest(parent, tokens[lo : lo + length], salt, state.params.cache_scope)

    # --- reuse --------------------------------------------------------------------------------------
    def plan(self, state: _ThinkerState) -> None:
        """At the request's first step (before its encode, outside the engine's lock: a media
        item's digest reads all of its input): the cached blocks of its longest cached prefix, cut
        back so that no media item is cut through; the slices of the items inside it are dropped."""
        state.prefix_planned = True
        if not self.enabled or state.spoken is not None:
            return
        if state.media is not None:
            state.items = media_items(state.media, state.prompt_ids, self.config)
            state.prompt_positions = state.media.positions.to("cpu", torch.float64)
        ids, size = state.prompt_ids, self.cache.block_size
        limit = len(ids) - 1  # the last position is computed: its logits choose the first token
        keys = state.prefix_keys = self.keys(state, ids)
        blocks, reuse = self.cache.lookup(
            keys, limit, lambda full, length: self.tail_key(state, ids, keys, full, length)
        )
        moved = True
        while moved:
            moved = False
            for item in state.items:
                if item.first < reuse <= item.last:
                    reuse, moved = item.first, True
        self.cache.count_query(len(ids), reuse)
        if reuse == 0:
            return
        inside = {(item.kind, item.index) for item in state.items if item.last < reuse}
        state.slices = [s for s in state.slices if (s.kind, s.item) not in inside]
        state.reuse = (blocks[: -(-reuse // size)], reuse)

    def load(self, state: _ThinkerState) -> None:
        """Put the planned prefix into the request's fresh slot: its KV, and its deep rows."""
        if state.reuse is None:
            return
        blocks, reuse = state.reuse
        state.reuse = None
        self.kv.load(state.held_slot, self.cache.kv_of(blocks, reuse))
        mm = sum(1 for t in state.prompt_ids[:reuse] if t in self.multimodal_ids)
        if mm:
            deep = torch.cat([b.extra for b in blocks if b.extra is not None])[:mm]
            state.deep_rows = [deep]
        state.prefilled = state.cached_tokens = reuse

    # --- store --------------------------------------------------------------------------------------
    def store(self, state: _ThinkerState, deep: torch.Tensor | None, answer: bool) -> None:
        """Keep the computed blocks of the request's sequence, its last partial one included: the
        prompt's (after its second token, with `deep`, the deep rows of its multimodal positions) or the
        prompt's and the answer's (when it ended; the answer's last token has no KV)."""
        if not self.enabled or state.slot is None or state.spoken is not None:
            return
        try:
            if deep is not None:
                state.prompt_deep = deep
            tokens = list(state.prompt_ids) + (state.generated[:-1] if answer else [])
            tokens = tokens[: self.kv.lengths[state.slot]]
            size, slot = self.cache.block_size, state.slot
            keys = state.prefix_keys = self.keys(state, tokens, state.prefix_keys)
            tail = None
            if len(tokens) % size:
                tail = self.tail_key(state, tokens, keys, len(keys), len(tokens) % size)
            # How many multimodal positions precede each position's end (numpy: thousands of ids).
            ordinals = np.isin(np.asarray(tokens, dtype=np.int64), self._multimodal_array).cumsum()

            def block_of(lo: int, hi: int) -> CachedBlock | None:
                extra = None
                first, last = int(ordinals[lo - 1]) if lo else 0, int(ordinals[hi - 1])
                if last > first:
                    if state.prompt_deep is None:
                        return None  # its deep rows are gone: not a block a reuse could use
                    extra = state.prompt_deep[first:last].clone()
                return CachedBlock(self.kv.read(slot, lo, hi), extra)

            self.cache.store_sequence(keys, tail, len(tokens), block_of, state.params.cache_scope)
        except Exception:  # the cache is an optimisation: a failure to store never fails the request
            log.exception("thinker: storing the prefix of %s failed", state.request_id)


def _salt_of(block: np.ndarray, plain: bool, items: list[bytes]) -> bytes:
    """A block's salt from its [3, n] float64 positions, whether they are its sequence indexes, and
    the digests of the media items it holds placeholders of (in prompt order)."""
    if plain and not items:
        return b""
    salt = hashlib.sha256(b"" if plain else b"positions\0" + np.ascontiguousarray(block).tobytes())
    for digest in items:
        salt.update(digest)
    return salt.digest()
