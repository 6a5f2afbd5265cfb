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

A request may name a cache scope (`scope`: bytes, b"" the shared one): its keys start from that
scope's root, so it finds only what requests of the same scope stored, and the scope's blocks can
be released at once (`request_release`, applied by the engine thread before its next step). A
realtime session is such a scope: the gateway gives it a random secret, never shown, so no other
client can find (or time) its content, and frees its share when it ends.

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
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

DEFAULT_BLOCK_SIZE = 16
ENDED_SCOPES_KEPT = 4096  # released scopes remembered, so that late stores for them are refused


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
    released_blocks: int = 0  # dropped because their scope ended


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
        self._scopes: dict[bytes, set[bytes]] = {}  # a named scope's stored keys
        self._scope_of: dict[bytes, bytes] = {}  # key -> its named scope
        self._releases: list[bytes] = []  # scopes ended, to release on the engine thread
        # Scopes released lately: a request of one still running (its abort on its way) stores
        # nothing more for it.
        self._ended: OrderedDict[bytes, None] = OrderedDict()
        self._releases_lock = threading.Lock()
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

    def root(self, scope: bytes = b"") -> bytes:
        """Where a scope's chains start (b"": the shared scope)."""
        return hashlib.sha256(self._root + b"scope\0" + scope).digest() if scope else self._root

    def digests(
        self,
        tokens: Sequence[int],
        salts: Sequence[bytes] | None = None,
        scope: bytes = b"",
        parent: bytes | None = None,
    ) -> list[bytes]:
        """The chained key of each full block of `tokens`; `salts[i]`: block i's extra key bytes;
        `parent`: the key of the block before `tokens` (None: they start the sequence)."""
        keys: list[bytes] = []
        parent = self.root(scope) if parent is None else parent
        size = self.block_size
        for i in range(len(tokens) // size):
            h = hashlib.sha256(parent)
            h.update(array("q", tokens[i * size : (i + 1) * size]).tobytes())
            if salts is not None:
                h.update(salts[i])
            parent = h.digest()
            keys.append(parent)
        return keys

    def tail_digest(
        self, parent: bytes | None, tokens: Sequence[int], salt: bytes = b"", scope: bytes = b""
    ) -> bytes:
        """The key of a partial block of `tokens` (fewer than `block_size`) after the full block
        `parent` (None: at the start of `scope`'s chains)."""
        h = hashlib.sha256(b"tail\0" + (parent if parent is not None else self.root(scope)))
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

    def lookup(
        self, keys: Sequence[bytes], limit_tokens: int, tail_key: Callable[[int, int], bytes]
    ) -> tuple[list[CachedBlock], int]:
        """The longest cached prefix, at most `limit_tokens` long: its whole blocks (`match`), then
        the longest cached tail of the next block (`tail_key(full, length)`: the key of the first
        `length` positions after `full` whole blocks); (its blocks, its length in positions)."""
        blocks = self.match(keys, limit_tokens)
        full = len(blocks)
        reuse = full * self.block_size
        if self.enabled:
            for length in range(min(self.block_size - 1, limit_tokens - reuse), 0, -1):  # longest first
                key = tail_key(full, length)
                tail = self._blocks.get(key)
                if tail is not None:
                    blocks.append(tail)
                    self._touch([*keys[:full], key])
                    return blocks, reuse + length
        return blocks, reuse

    def count_query(self, queried: int, hit: int) -> None:
        self.stats.queries += queried
        self.stats.hits += hit

    def missing(self, keys: Sequence[bytes]) -> list[int]:
        """Indexes of `keys` not cached (what a store should copy out)."""
        return [i for i, key in enumerate(keys) if key not in self._blocks]

    def store(self, key: bytes, block: CachedBlock, scope: bytes = b"") -> None:
        """Keep `block` under `key` (a block already there is kept: same key, same rows); `scope`:
        the scope whose chain it is (its key starts from that scope's root)."""
        if (
            not self.enabled
            or block.nbytes > self.budget_bytes
            or key in self._blocks
            or scope in self._ended
        ):
            return
        self._blocks[key] = block
        self.cached_bytes += block.nbytes
        self.stats.stored_blocks += 1
        if scope:
            self._scopes.setdefault(scope, set()).add(key)
            self._scope_of[key] = scope
        self._evict()

    def request_release(self, scope: bytes) -> None:
        """Any thread: `scope` ended; its blocks go at the engine thread's next `apply_releases`."""
        if scope:
            with self._releases_lock:
                self._releases.append(scope)

    def apply_releases(self) -> int:
        """Engine thread: drop the blocks of the scopes that ended; how many went."""
        if not self._releases:  # every step asks: no lock while none ended (a list read is atomic)
            return 0
        with self._releases_lock:
            scopes, self._releases = self._releases, []
        dropped = 0
        for scope in scopes:
            self._ended[scope] = None
            while len(self._ended) > ENDED_SCOPES_KEPT:
                self._ended.popitem(last=False)
            for key in self._scopes.pop(scope, ()):
                self._scope_of.pop(key, None)
                block = self._blocks.pop(key, None)
                if block is not None:
                    self.cached_bytes -= block.nbytes
                    dropped += 1
        self.stats.released_blocks += dropped
        return dropped

    def touch_chain(self, keys: Sequence[bytes]) -> None:
        """Mark a stored chain used, its first block most recent (see the module doc)."""
        self._touch(keys)

    def store_sequence(
        self,
        keys: Sequence[bytes],
        tail: bytes | None,
        length: int,
        block_of: Callable[[int, int], CachedBlock | None],
        scope: bytes = b"",
    ) -> None:
        """Keep a computed sequence of `length` positions: its whole blocks under `keys` and its
        partial last one under `tail` (None: it has none), each made by `block_of(lo, hi)` only if
        not cached already (None: not one to keep); then touch the chain."""
        size = self.block_size
        ranges = [(keys[b], b * size, (b + 1) * size) for b in self.missing(keys)]
        chain = list(keys)
        if tail is not None:
            chain.append(tail)
            if self.get(tail) is None:
                ranges.append((tail, len(keys) * size, length))
        for key, lo, hi in ranges:
            block = block_of(lo, hi)
            if block is not None:
                self.store(key, block, scope)
        self.touch_chain(chain)

    @staticmethod
    def kv_of(blocks: Sequence[CachedBlock], length: int) -> torch.Tensor:
        """The first `length` positions of `blocks`' KV, as one tensor (what `SlotKVCache.load` takes)."""
        return torch.cat([b.kv for b in blocks], dim=3)[:, :, :, :length]

    def resize(self, budget_bytes: int) -> None:
        """A new budget (an operator's, or a test's); what lies over it is evicted at once, least
        recently used first."""
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._evict()

    def clear(self) -> None:
        self._blocks.clear()
        self._scopes.clear()
        self._scope_of.clear()
        self.cached_bytes = 0

    def _touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def _evict(self) -> None:
        while self.cached_bytes > self.budget_bytes and self._blocks:
            key, block = self._blocks.popitem(last=False)
            self.cached_bytes -= block.nbytes
            self.stats.evicted_blocks += 1
            scope = self._scope_of.pop(key, None)
            if scope is not None:
                keys = self._scopes[scope]
                keys.discard(key)
                if not keys:
                    del self._scopes[scope]
