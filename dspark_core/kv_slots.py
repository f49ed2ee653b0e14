"""Per-request key/value slots: one tensor per layer, a length per slot, rollback by lowering a length.

Target and drafters alike keep many requests' caches side by side. Rejected positions need no
copying: a lower length masks them out of the next attention and the slot overwrites them when it
grows again. Everything that reads or writes the slots lives here; the forwards only ask for views.

A forward over slots `rows` needs each layer's keys/values as one [R, kv_heads, past + new, head_dim]
tensor. When `rows` is a contiguous ascending range (an engine whose slots are all busy) that tensor is
a *view* of the slots; any other `rows` costs one gather copy, unless the forward runs over the range
that covers them, idle slots included (`covering_range`): a few holes cost less compute than the copy.
Two ways to place a forward's new keys/values:

- `window` (the target's lean forward, `decoder_forward.py`): each row's new positions are written
  straight behind its own length, once; the mask is one comparison per row; `SlotWindow.close` only
  bumps the lengths (and writes a gathered copy back).
- `attention_buffers` + `append` (Hugging Face's own forward through `hf_cache`, and the drafters' blocks):
  the new positions are written at [max past, max past + new), past every row's own length, and `append`
  then moves them behind each row's length (nothing to move when every row has the same length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

try:  # transformers >= 4.56: caches are lists of layers
    from transformers.cache_utils import DynamicLayer as _DynamicLayer
except ImportError:  # pragma: no cover - older transformers: `hf_cache` gathers and Hugging Face concatenates
    _DynamicLayer = None


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
        return self._gathered(rows, past, total)

    def window(self, rows: Tensor, num_new: Tensor, max_new: int) -> "SlotWindow":
        """A forward's keys/values over slots `rows`, new positions behind each row's own length (`SlotWindow`)."""
        self.check_room(rows, num_new)
        past = self.lengths[rows]
        max_past = int(past.max()) if len(rows) else 0
        total = max_past + max_new
        span = row_span(rows)
        in_place = span is not None and total <= self.capacity
        if in_place:
            buffers = [(k[span, :, :total], v[span, :, :total]) for k, v in zip(self.keys, self.values)]
        else:
            buffers = self._gathered(rows, max_past, total, zero_tail=True)
        positions = past[:, None] + torch.arange(max_new, device=past.device)[None, :]
        uniform = len(rows) > 0 and int(past.min()) == max_past
        return SlotWindow(self, rows, past, num_new, positions, buffers, in_place, uniform)

    def _gathered(self, rows: Tensor, past: int, total: int, zero_tail: bool = False) -> list[tuple[Tensor, Tensor]]:
        """Copies of slots `rows` [R, kv_heads, total, head_dim] holding their first `past` positions. `zero_tail`:
        the rest zeroed, where a window's short rows leave positions unwritten that its mask hides (a masked key
        still meets its value with weight 0, and 0 · NaN from uninitialised memory would be NaN)."""
        out = []
        for k, v in zip(self.keys, self.values):
            kb = k.new_empty((len(rows), k.shape[1], total, k.shape[3]))
            vb = v.new_empty((len(rows), v.shape[1], total, v.shape[3]))
            kb[:, :, :past] = k[rows, :, :past]
            vb[:, :, :past] = v[rows, :, :past]
            if zero_tail:
                kb[:, :, past:] = 0
                vb[:, :, past:] = 0
            out.append((kb, vb))
        return out

    def valid_mask(self, rows: Tensor, length: int) -> Tensor:
        """[R, length] bool: which gathered positions each row really holds."""
        return torch.arange(length, device=self.lengths.device)[None, :] < self.lengths[rows][:, None]

    def append(self, rows: Tensor, new_kv: list[tuple[Tensor, Tensor]], num_new: Tensor) -> None:
        """Write the first `num_new[r]` positions of new (k, v) [R, kv_heads, max_new, head_dim] behind each row.

        New keys/values that already sit there (views of `attention_buffers` in place, every row as long as the
        longest) are not copied onto themselves."""
        self.check_room(rows, num_new)
        max_new = new_kv[0][0].shape[2]
        if new_kv and self._already_behind(rows, new_kv):
            self.lengths[rows] += num_new
            return
        if len(rows) == 1:  # one row (every step at concurrency 1): two slice copies per layer, not ~15 indexing ops
            row, start, count = int(rows[0]), int(self.lengths[rows[0]]), int(num_new[0])
            for layer, (k, v) in enumerate(new_kv):
                self.keys[layer][row, :, start : start + count] = k[0, :, :count]
                self.values[layer][row, :, start : start + count] = v[0, :, :count]
            self.lengths[rows] += num_new
            return
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

    def _already_behind(self, rows: Tensor, new_kv: list[tuple[Tensor, Tensor]]) -> bool:
        """Whether every layer's new (k, v) [R, kv_heads, max_new, head_dim] is the slots' own memory right behind
        every row (then `append` has nothing to copy)."""
        span = row_span(rows)
        past = self.lengths[rows]
        if span is None or int(past.min()) != int(past.max()):
            return False
        start = int(past[0])
        for layer, (k, v) in enumerate(new_kv):
            for slots, new in ((self.keys[layer], k), (self.values[layer], v)):
                offset = (span.start * slots.stride(0) + start * slots.stride(2)) * slots.element_size()
                if new.data_ptr() != slots.data_ptr() + offset or new.stride() != slots.stride():
                    return False
        return True

    def rollback(self, rows: Tensor, lengths: Tensor) -> None:
        """Cut slots `rows` back to `lengths` (the accepted prefix); never grows a slot."""
        if bool((lengths > self.lengths[rows]).any()):
            raise ValueError("rollback cannot grow a slot")
        self.lengths[rows] = lengths


@dataclass
class SlotWindow:
    """One forward's keys/values over slots `rows` (`KVSlots.window`): per layer (k, v) [R, kv_heads, total,
    head_dim], total = longest past + max_new; views of the slots when `in_place`, else gathered copies.

    Row r's new positions j go to past_r + j (`positions`), right behind its own cached ones, so attention
    over the window needs only `key ≤ past_r + j` (`decoder_forward.additive_mask`). Padded positions
    (j ≥ num_new_r) are written too, past the row's new length: garbage no later forward reads."""

    slots: KVSlots
    rows: Tensor  # [R]
    past_lengths: Tensor  # [R] positions each row held before this forward
    num_new: Tensor  # [R] valid new positions per row
    positions: Tensor  # [R, max_new]: past_r + j, each new token's position (and its key's slot index)
    buffers: list[tuple[Tensor, Tensor]]
    in_place: bool
    uniform: bool  # every row held as many positions: the new ones are one slice [past, past + max_new)

    @property
    def total(self) -> int:
        return self.buffers[0][0].shape[2]

    def write(self, layer: int, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write one layer's new (k, v) [R, kv_heads, max_new, head_dim]; returns the window's (k, v) to attend."""
        kb, vb = self.buffers[layer]
        if self.uniform:
            start = int(self.past_lengths[0]) if len(self.rows) else 0
            kb[:, :, start : start + keys.shape[2]] = keys
            vb[:, :, start : start + values.shape[2]] = values
        else:
            row = torch.arange(len(self.rows), device=keys.device)[:, None]
            kb[row, :, self.positions] = keys.transpose(1, 2)
            vb[row, :, self.positions] = values.transpose(1, 2)
        return kb, vb

    def close(self) -> None:
        """Commit the valid new positions: a gathered window's are copied back into the slots."""
        if not self.in_place and len(self.rows):
            valid = torch.arange(self.positions.shape[1], device=self.rows.device)[None, :] < self.num_new[:, None]
            slot = self.rows[:, None].expand_as(self.positions)[valid]
            src = torch.arange(len(self.rows), device=self.rows.device)[:, None].expand_as(self.positions)[valid]
            pos = self.positions[valid]
            for layer, (kb, vb) in enumerate(self.buffers):
                self.slots.keys[layer][slot, :, pos] = kb[src, :, pos]
                self.slots.values[layer][slot, :, pos] = vb[src, :, pos]
        self.slots.lengths[self.rows] += self.num_new


def hf_cache(buffers: list[tuple[Tensor, Tensor]] | None, past: int, gathered=()):
    """A Hugging Face `DynamicCache` over `KVSlots.attention_buffers` (`_SlotLayer`s: new keys/values written at
    [past, past + n) in place, nothing concatenated); without cache layers (transformers < 4.56), one filled
    from `gathered` (`KVSlots.gather`) that Hugging Face concatenates onto."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if buffers is not None:
        cache.layers = [_SlotLayer(k, v, past) for k, v in buffers]
    else:
        for layer, (k, v) in enumerate(gathered):
            cache.update(k, v, layer)
    return cache


def hf_cache_layers(cache) -> list[tuple[Tensor, Tensor]]:
    """Key/value tensors of a `DynamicCache`, across the transformers 4 → 5 layout change."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


if _DynamicLayer is not None:

    class _SlotLayer(_DynamicLayer):
        """A Hugging Face cache layer over one layer's `KVSlots.attention_buffers` (k, v) [R, kv_heads, total,
        head_dim], holding `past` positions: `update` writes the new keys/values at [past, past + n) and
        returns views up to there, so nothing is concatenated."""

        def __init__(self, keys: Tensor, values: Tensor, past: int):
            super().__init__()
            self._key_buffer, self._value_buffer, self._past = keys, values, past
            self.keys, self.values = keys[:, :, :past], values[:, :, :past]
            self.device = keys.device
            self.is_initialized = True

        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            end = self._past + key_states.shape[-2]
            self._key_buffer[:, :, self._past : end] = key_states
            self._value_buffer[:, :, self._past : end] = value_states
            self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
            return self.keys, self.values


class Cover(NamedTuple):
    """A forward over `span` (a contiguous slot range) standing for the rows at `at` in it (`covering_range`)."""

    span: Tensor  # [S] slot ids
    at: Tensor  # [R] where each requested row sits in `span`

    def spread(self, x: Tensor) -> Tensor:
        """Per-row `x` [R, …] laid over the span: zeros (no tokens, nothing new) for the idle slots."""
        out = x.new_zeros((len(self.span), *x.shape[1:]))
        out[self.at] = x
        return out

    def pick(self, x: Tensor) -> Tensor:
        """The requested rows of a per-span result [S, …]."""
        return x[self.at]


MAX_HOLE_FRACTION = 0.5  # idle slots a covering range may hold, per requested row


def covering_range(lengths: Tensor, rows: Tensor) -> Cover | None:
    """The contiguous slot range to run a forward over instead of `rows`, when that is the cheaper way.

    `rows` with holes (slots freed by finished requests, or not in this step) would cost one gather copy of
    every layer's cached keys/values per forward (`attention_buffers`); a forward over the whole range
    [rows[0], rows[-1]] reads them in place and pays instead for the idle slots' rows of compute. That wins
    while the holes are few (at most `MAX_HOLE_FRACTION` of the rows: on the embedded default a decode step
    over 63 of 64 slots took 23 ms with the gather and 16 ms without) and no idle slot holds a longer context
    than the rows do (its positions would lengthen every row's attention). Returns (range [S] long, where each
    row sits in it [R] long) as a `Cover`, or None: `rows` is already contiguous, unsorted, or better gathered.
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
    return Cover(span, rows - first)


def row_span(rows: Tensor) -> slice | None:
    """`rows` as a slice if it is a contiguous ascending range of slot indices (indexing then gives views)."""
    n = rows.numel()
    if n == 0:
        return None
    first, last = int(rows[0]), int(rows[-1])
    if last - first != n - 1 or (n > 2 and not bool((rows[1:] - rows[:-1] == 1).all())):
        return None
    return slice(first, first + n)
