"""Automatic prefix caching: the KV of a prompt's prefix that an earlier request computed, reused.

A conversation's next turn is its previous prompt and answer plus a new user turn, so most of each
turn's prompt was computed before. The cache keeps KV in blocks of `block_size` positions, each
keyed by a chained digest of everything its rows depend on (vLLM's automatic prefix caching):
the digest of the block before it, the block's tokens, and the caller's salt for the block (the
thinker's: its M-RoPE positions and the content of the media items in it). A prompt looks up its
blocks in order and stops at the first miss, so a hit is always a whole prefix. The key is the
content itself, never a request or session id: a request can only find KV for a prefix it sends.

A sequence's last, partial block is kept too, under a key of its own length (`tail_digest`): a
conversation's next turn starts with the whole previous prompt, and a media item near that
prompt's end lies in its last block, which would otherwise be encoded again every turn. A lookup
that stops at a missing full block tries the tails of that block's first positions, longest first.

Blocks are copies (a finished request's slot is reused at once) and are bounded by a byte budget
with LRU eviction. A chain is touched from its last block to its first, so a prefix's first blocks
are always the most recent and eviction takes a chain from its tail: the blocks left stay a usable
prefix. Only committed KV is stored (a failed step commits nothing), so a cancelled or failed
request leaves nothing wrong behind.

The cache itself is device-agnostic: a block's payload is whatever tensors the engine gives it (the
KV rows of every layer, and for the thinker the deep rows of the block's multimodal positions).
All methods run on the engine thread.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

DEFAULT_BLOCK_SIZE = 16


@dataclass
class CachedBlock:
    """One block's rows: `kv` [layers, 2 (key, value), heads, block_size, head_dim], and `extra`
    rows the engine keeps with it (the thinker: deep rows of the block's multimodal positions)."""

    kv: torch.Tensor
    extra: torch.Tensor | None = None
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        extra = 0 if self.extra is None else self.extra.numel() * self.extra.element_size()
        self.nbytes = self.kv.numel() * self.kv.element_size() + extra

    @property
    def positions(self) -> int:
        return int(self.kv.shape[3])


@dataclass
class PrefixStats:
    """Totals since start, in tokens as vLLM counts them (`prefix_cache_queries`/`_hits`)."""

    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, found cached
    stored_blocks: int = 0
    evicted_blocks: int = 0


class PrefixCache:
    """Blocks of KV keyed by chained content digests, at most `budget_bytes` of them (LRU)."""

    def __init__(
        self, budget_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE, namespace: bytes = b""
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        self.block_size = block_size
        self.budget_bytes = budget_bytes
        # What all keys start from: what else the rows depend on (model, layer taps), so a change
        # of those never finds blocks made before it.
        self._root = hashlib.sha256(b"omnistream-prefix\0" + namespace).digest()
        self._blocks: OrderedDict[bytes, CachedBlock] = OrderedDict()
        self.cached_bytes = 0
        self.stats = PrefixStats()

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def positions(self) -> int:
        """Sequence positions the cache holds, all blocks together."""
        return sum(block.positions for block in self._blocks.values())

    def digests(self, tokens: Sequence[int], salts: Sequence[bytes] | None = None) -> list[bytes]:
        """The chained key of each full block of `tokens`; `salts[i]`: block i's extra key bytes."""
        keys: list[bytes] = []
        parent = self._root
        size = self.block_size
        for i in range(len(tokens) // size):
            h = hashlib.sha256(parent)
            h.update(array("q", tokens[i * size : (i + 1) * size]).tobytes())
            if salts is not None:
                h.update(salts[i])
            parent = h.digest()
            keys.append(parent)
        return keys

    def tail_digest(self, parent: bytes | None, tokens: Sequence[int], salt: bytes = b"") -> bytes:
        """The key of a partial block of `tokens` (fewer than `block_size`) after the full block
        `parent` (None: at the start)."""
        h = hashlib.sha256(b"tail\0" + (parent if parent is not None else self._root))
        h.update(array("q", tokens).tobytes())
        h.update(salt)
        return h.digest()

    def get(self, key: bytes) -> CachedBlock | None:
        return self._blocks.get(key) if self.enabled else None

    def match(self, keys: Sequence[bytes], limit_tokens: int) -> list[CachedBlock]:
        """The cached blocks of the longest cached prefix of `keys`, at most `limit_tokens` long (the
        caller leaves at least its last position to compute); counts the query."""
        found: list[CachedBlock] = []
        if self.enabled:
            for key in keys[: max(0, limit_tokens) // self.block_size]:
                block = self._blocks.get(key)
                if block is None:
                    break
                found.append(block)
            self._touch(keys[: len(found)])
        return found

    def count_query(self, queried: int, hit: int) -> None:
        self.stats.queries += queried
        self.stats.hits += hit

    def missing(self, keys: Sequence[bytes]) -> list[int]:
        """Indexes of `keys` not cached (what a store should copy out)."""
        return [i for i, key in enumerate(keys) if key not in self._blocks]

    def store(self, key: bytes, block: CachedBlock) -> None:
        """Keep `block` under `key` (a block already there is kept: same key, same rows)."""
        if not self.enabled or block.nbytes > self.budget_bytes or key in self._blocks:
            return
        self._blocks[key] = block
        self.cached_bytes += block.nbytes
        self.stats.stored_blocks += 1
        self._evict()

    def touch_chain(self, keys: Sequence[bytes]) -> None:
        """Mark a stored chain used, its first block most recent (see the module doc)."""
        self._touch(keys)

    def resize(self, budget_bytes: int) -> None:
        """A new budget (an operator's, or a test's); what lies over it is evicted at once, least
        recently used first."""
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._evict()

    def clear(self) -> None:
        self._blocks.clear()
        self.cached_bytes = 0

    def _touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def _evict(self) -> None:
        while self.cached_bytes > self.budget_bytes and self._blocks:
            _, block = self._blocks.popitem(last=False)
            self.cached_bytes -= block.nbytes
            self.stats.evicted_blocks += 1
