"""A slot-based KV cache that lets requests of different lengths share one batched forward.

Each running request owns a slot (a row of preallocated key/value tensors) and its own length. For a
step, `plan()` says which slots take part and where each row writes; the attention layers call
`update()` (the `transformers` Cache protocol), which writes the new keys at each row's own position
and returns the rows' keys padded to the longest. `attention_mask()` hides each row's padding, so a
request computes the same thing whether it is alone or batched.
"""

from __future__ import annotations

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
        self.lengths = [0] * slots
        self._free = list(range(slots - 1, -1, -1))
        self._rows: torch.Tensor | None = None
        self._starts: list[int] = []
        self._q_len = 0
        self._kv_len = 0

    @classmethod
    def for_text_config(cls, text, slots: int, capacity: int, dtype: torch.dtype, device) -> SlotKVCache:
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

    # --- one forward ----------------------------------------------------------------------------
    def plan(self, slots: list[int], q_len: int) -> None:
        """Prepare a forward of `q_len` new positions for each slot in `slots` (same order as the batch)."""
        self._starts = [self.lengths[s] for s in slots]
        end = max(self._starts) + q_len
        if end > self.capacity:
            raise ValueError(f"sequence would exceed the KV capacity of {self.capacity}")
        device = self.keys[0].device
        self._rows = torch.tensor(slots, dtype=torch.long, device=device)
        self._q_len = q_len
        self._kv_len = end

    def attention_mask(self) -> torch.Tensor:
        """Boolean [B, 1, q, kv]: row i, query j sees keys 0..start_i + j."""
        device = self.keys[0].device
        starts = torch.tensor(self._starts, device=device).view(-1, 1, 1)
        q = torch.arange(self._q_len, device=device).view(1, -1, 1)
        k = torch.arange(self._kv_len, device=device).view(1, 1, -1)
        return (k <= starts + q).unsqueeze(1)

    def positions(self) -> torch.Tensor:
        """[B, q] absolute positions of the new tokens."""
        device = self.keys[0].device
        starts = torch.tensor(self._starts, device=device).view(-1, 1)
        return starts + torch.arange(self._q_len, device=device).view(1, -1)

    def commit(self) -> None:
        """Advance each row's length once the forward has run."""
        assert self._rows is not None
        for slot, start in zip(self._rows.tolist(), self._starts, strict=True):
            self.lengths[slot] = start + self._q_len
        self._rows = None

    # --- transformers Cache protocol ------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx: int, kwargs=None, **_):
        rows = self._rows
        assert rows is not None, "plan() must be called before the forward"
        k_all, v_all = self.keys[layer_idx], self.values[layer_idx]
        q = self._q_len
        if len(self._starts) == 1:
            s, start = int(rows[0]), self._starts[0]
            k_all[s, :, start : start + q] = key_states[0]
            v_all[s, :, start : start + q] = value_states[0]
            return k_all[s : s + 1, :, : self._kv_len], v_all[s : s + 1, :, : self._kv_len]
        if q == 1:
            pos = torch.tensor(self._starts, device=rows.device)
            k_all[rows, :, pos] = key_states[:, :, 0]
            v_all[rows, :, pos] = value_states[:, :, 0]
        else:
            for i, start in enumerate(self._starts):
                k_all[rows[i], :, start : start + q] = key_states[i]
                v_all[rows[i], :, start : start + q] = value_states[i]
        return k_all[rows, :, : self._kv_len], v_all[rows, :, : self._kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len - self._q_len if self._rows is not None else 0
