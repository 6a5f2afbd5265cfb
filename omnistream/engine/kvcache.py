"""A slot-based KV cache that lets requests of different lengths share one batched forward.

Each running request owns a slot (a row of preallocated key/value tensors) and its own length. For a
step, `plan()` says which slots take part and where each row writes; the attention layers call
`update()` (the `transformers` Cache protocol), which writes the new keys at each row's own position
and returns the rows' keys padded to the longest. `attention_mask()` hides each row's padding, so a
request computes the same thing whether it is alone or batched.

Everything a step needs on the device (slot rows, positions, hence the mask and the write indices)
is built once in `plan()` on the host and moved in one non-blocking copy: `update()` runs once per
layer and must never wait for the device (no `int()`, `.tolist()` or new tensors there), or a
48-layer model would stall the GPU 48 times per token.
"""

from __future__ import annotations

from typing import Any

import torch


class SlotKVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        slots: int,
        capacity: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
    ) -> None:
        self.num_layers = num_layers
        self.capacity = capacity
        shape = (slots, num_kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.device = self.keys[0].device
        self.lengths = [0] * slots
        self._free = list(range(slots - 1, -1, -1))
        self._key_index = torch.arange(capacity, device=self.device)  # for the masks, made once
        self._planned = False
        self._slots: list[int] = []
        self._starts: list[int] = []
        self._q_len = 0
        self._kv_len = 0
        self._rows: torch.Tensor | None = None  # [B] slot of each row (device)
        self._positions: torch.Tensor | None = None  # [B, q] absolute positions (device)
        self._mask: torch.Tensor | None = None

    @classmethod
    def for_text_config(
        cls, text: Any, slots: int, capacity: int, dtype: torch.dtype, device: str | torch.device
    ) -> SlotKVCache:
        """Sized for a decoder described by a transformers text config (thinker or talker)."""
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        return cls(text.num_hidden_layers, text.num_key_value_heads, head_dim, slots, capacity, dtype, device)

    # --- slot bookkeeping -------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV slot")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    # --- prefix reuse (omnistream/engine/prefix_cache.py) -------------------------------------------
    def read(self, slot: int, start: int, end: int) -> torch.Tensor:
        """A copy of positions [start, end) of `slot`: [layers, 2 (key, value), heads, n, head_dim]."""
        if not 0 <= start <= end <= self.lengths[slot]:
            raise ValueError(f"positions [{start}, {end}) are not all computed in slot {slot}")
        pairs = zip(self.keys, self.values, strict=True)
        return torch.stack([torch.stack((k[slot, :, start:end], v[slot, :, start:end])) for k, v in pairs])

    def load(self, slot: int, rows: torch.Tensor) -> None:
        """Put `rows` (as `read` returns them) at positions [0, n) of a fresh `slot`, whose length
        becomes n: the KV of a prefix another request computed."""
        n = int(rows.shape[3])
        if self.lengths[slot] != 0 or n > self.capacity:
            raise ValueError(f"slot {slot} is not fresh or {n} positions exceed its capacity")
        rows = rows.to(self.device)
        for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            k[slot, :, :n] = rows[layer, 0]
            v[slot, :, :n] = rows[layer, 1]
        self.lengths[slot] = n

    # --- one forward ----------------------------------------------------------------------------
    def plan(self, slots: list[int], q_len: int) -> None:
        """Prepare a forward of `q_len` new positions for each slot in `slots` (same order as the batch)."""
        starts = [self.lengths[s] for s in slots]
        end = max(starts) + q_len
        if end > self.capacity:
            raise ValueError(f"sequence would exceed the KV capacity of {self.capacity}")
        batch = len(slots)
        host = torch.empty((batch, 1 + q_len), dtype=torch.long)
        host[:, 0] = torch.as_tensor(slots, dtype=torch.long)
        host[:, 1:] = torch.as_tensor(starts, dtype=torch.long).view(-1, 1) + torch.arange(q_len).view(1, -1)
        if self.device.type == "cuda":
            host = host.pin_memory()
        planned = host.to(self.device, non_blocking=True)  # the step's one host -> device copy
        self._rows = planned[:, 0]
        self._positions = planned[:, 1:]
        # [B, 1, q, kv]: row i, query j sees keys 0..start_i + j. Additive (0 / -inf, the cache's dtype):
        # SDPA turns a boolean mask into exactly this in every layer's call (at 1,800 keys a quarter of
        # a tiny model's attention time on a CPU); made once here, the layers only read it.
        seen = (self._key_index[:end].view(1, 1, -1) <= self._positions.unsqueeze(-1)).unsqueeze(1)
        hidden = torch.zeros(seen.shape, dtype=self.keys[0].dtype, device=self.device)
        self._mask = hidden.masked_fill_(seen.logical_not(), float("-inf"))
        self._slots = list(slots)
        self._starts = starts
        self._q_len = q_len
        self._kv_len = end
        self._planned = True

    @property
    def rows(self) -> torch.Tensor:
        """[B] slot of each row of the last planned step, on the device (kept after `commit`)."""
        assert self._rows is not None, "plan() first"
        return self._rows

    def attention_mask(self) -> torch.Tensor:
        """Additive [B, 1, q, kv] (0 where row i's query j sees key i: keys 0..start_i + j, else -inf)."""
        assert self._mask is not None, "plan() first"
        return self._mask

    def positions(self) -> torch.Tensor:
        """[B, q] absolute positions of the new tokens."""
        assert self._positions is not None, "plan() first"
        return self._positions

    def commit(self) -> None:
        """Advance each row's length once the forward has run."""
        assert self._planned
        for slot, start in zip(self._slots, self._starts, strict=True):
            self.lengths[slot] = start + self._q_len
        self._planned = False

    # --- transformers Cache protocol ------------------------------------------------------------
    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        kwargs: Any = None,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._planned, "plan() must be called before the forward"
        k_all, v_all = self.keys[layer_idx], self.values[layer_idx]
        q, kv = self._q_len, self._kv_len
        if len(self._slots) == 1:  # host ints only: plain slices, no index tensors
            s, start = self._slots[0], self._starts[0]
            k_all[s, :, start : start + q] = key_states[0]
            v_all[s, :, start : start + q] = value_states[0]
            return k_all[s : s + 1, :, :kv], v_all[s : s + 1, :, :kv]
        rows, positions = self._rows, self._positions
        assert rows is not None and positions is not None
        # Row i's query j goes to (slot_i, :, position_ij): indexed [B, q, heads, dim].
        k_all[rows.view(-1, 1), :, positions] = key_states.transpose(1, 2)
        v_all[rows.view(-1, 1), :, positions] = value_states.transpose(1, 2)
        return k_all[rows, :, :kv], v_all[rows, :, :kv]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len - self._q_len if self._planned else 0
