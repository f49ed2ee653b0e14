"""Per-request key/value slots: one tensor per layer, a length per slot, rollback by lowering a length.

Target and drafters alike keep many requests' caches side by side. Rejected positions need no
copying: a lower length masks them out of the next attention and the slot overwrites them when it
grows again.

A forward over slots `rows` needs each layer's keys/values as one [R, kv_heads, past + new, head_dim]
tensor. When `rows` is a contiguous ascending range (an engine whose slots are all busy) that tensor is
a *view* of the slots: the new positions are written at [past, past + new), past every row's own
length (so over nothing it holds), and `append` then moves them behind each row's length. Any other
`rows` costs one gather copy (`attention_buffers`), unless the forward runs over the range that covers them,
idle slots included (`covering_range`): a few holes cost less compute than the copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KVSlots:
    keys: list[Tensor]  # each [num_slots, kv_heads, capacity, head_dim]
    values: list[Tensor]  # each [num_slots, kv_heads, capacity, head_dim]
    lengths: Tensor  # [num_slots] long, positions held

    @classmethod
    def allocate(
        cls, num_layers: int, num_slots: int, num_kv_heads: int, capacity: int, head_dim: int,
        dtype: torch.dtype, device: torch.device | str,
    ) -> "KVSlots":
        shape = (num_slots, num_kv_heads, capacity, head_dim)
        return cls(
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            torch.zeros(num_slots, dtype=torch.long, device=device),
        )

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def check_room(self, rows: Tensor, num_new: Tensor) -> None:
        if bool((self.lengths[rows] + num_new > self.capacity).any()):
            raise ValueError(f"KV slot capacity {self.capacity} exceeded; raise the capacity")

    def gather(self, rows: Tensor, length: int) -> list[tuple[Tensor, Tensor]]:
        """Per layer (k, v) [R, kv_heads, length, head_dim] of slots `rows`, cut to `length`."""
        return [(k[rows, :, :length], v[rows, :, :length]) for k, v in zip(self.keys, self.values)]

    def attention_buffers(self, rows: Tensor, past: int, total: int) -> list[tuple[Tensor, Tensor]]:
        """Per layer (k, v) [R, kv_heads, total, head_dim]: positions < `past` hold slots `rows` (garbage past
        each row's length), positions past … total − 1 are scratch for the new ones. Views of the slots when
        `rows` is a contiguous ascending range and `total` fits the capacity; otherwise a gathered copy."""
        span = row_span(rows)
        if span is not None and total <= self.capacity:
            return [(k[span, :, :total], v[span, :, :total]) for k, v in zip(self.keys, self.values)]
        out = []
        for k, v in zip(self.keys, self.values):
            kb = k.new_empty((len(rows), k.shape[1], total, k.shape[3]))
            vb = v.new_empty((len(rows), v.shape[1], total, v.shape[3]))
            kb[:, :, :past] = k[rows, :, :past]
            vb[:, :, :past] = v[rows, :, :past]
            out.append((kb, vb))
        return out

    def valid_mask(self, rows: Tensor, length: int) -> Tensor:
        """[R, length] bool: which gathered positions each row really holds."""
        return torch.arange(length, device=self.lengths.device)[None, :] < self.lengths[rows][:, None]

    def append(self, rows: Tensor, new_kv: list[tuple[Tensor, Tensor]], num_new: Tensor) -> None:
        """Write the first `num_new[r]` positions of new (k, v) [R, kv_heads, max_new, head_dim] behind each row."""
        self.check_room(rows, num_new)
        max_new = new_kv[0][0].shape[2]
        offsets = torch.arange(max_new, device=self.lengths.device)
        valid = offsets[None, :] < num_new[:, None]  # [R, max_new]
        slot = rows[:, None].expand(-1, max_new)[valid]
        dest = (self.lengths[rows][:, None] + offsets[None, :])[valid]
        src_row = torch.arange(len(rows), device=self.lengths.device)[:, None].expand(-1, max_new)[valid]
        src_pos = offsets[None, :].expand(len(rows), -1)[valid]
        for layer, (k, v) in enumerate(new_kv):
            self.keys[layer][slot, :, dest] = k[src_row, :, src_pos].to(self.keys[layer].dtype)
            self.values[layer][slot, :, dest] = v[src_row, :, src_pos].to(self.values[layer].dtype)
        self.lengths[rows] += num_new

    def rollback(self, rows: Tensor, lengths: Tensor) -> None:
        """Cut slots `rows` back to `lengths` (the accepted prefix); never grows a slot."""
        if bool((lengths > self.lengths[rows]).any()):
            raise ValueError("rollback cannot grow a slot")
        self.lengths[rows] = lengths


MAX_HOLE_FRACTION = 0.5  # idle slots a covering range may hold, per requested row


def covering_range(lengths: Tensor, rows: Tensor) -> tuple[Tensor, Tensor] | None:
    """The contiguous slot range to run a forward over instead of `rows`, when that is the cheaper way.

    `rows` with holes (slots freed by finished requests, or not in this step) would cost one gather copy of
    every layer's cached keys/values per forward (`attention_buffers`); a forward over the whole range
    [rows[0], rows[-1]] reads them in place and pays instead for the idle slots' rows of compute. That wins
    while the holes are few (at most `MAX_HOLE_FRACTION` of the rows: on the embedded default a decode step
    over 63 of 64 slots took 23 ms with the gather and 16 ms without) and no idle slot holds a longer context
    than the rows do (its positions would lengthen every row's attention). Returns (range [S] long, where each
    row sits in it [R] long), or None: `rows` is already contiguous, unsorted, or better gathered.
    """
    n = rows.numel()
    if n < 2:
        return None
    first, last = int(rows[0]), int(rows[-1])
    size = last - first + 1
    if size == n or size - n > MAX_HOLE_FRACTION * n or not bool((rows[1:] > rows[:-1]).all()):
        return None
    span = torch.arange(first, last + 1, device=rows.device)
    if int(lengths[span].max()) > int(lengths[rows].max()):
        return None
    return span, rows - first


def row_span(rows: Tensor) -> slice | None:
    """`rows` as a slice if it is a contiguous ascending range of slot indices (indexing then gives views)."""
    n = rows.numel()
    if n == 0:
        return None
    first, last = int(rows[0]), int(rows[-1])
    if last - first != n - 1 or (n > 2 and not bool((rows[1:] - rows[:-1] == 1).all())):
        return None
    return slice(first, first + n)
