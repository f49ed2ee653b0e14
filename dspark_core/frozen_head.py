"""A draft's frozen LM head in bf16 while it trains, where the CPU has native bf16 dot products.

The LM head (the target's, frozen) is a draft training step's largest product: [positions, hidden] ×
[hidden, draft vocab] forward and the gradient through it back, 896 × 576 × 8,192 each for SmolLM2-135M's drafts.
In fp32 they took 82 + 43 ms on a 2-core AMD Zen 4, in bf16 21 + 20 ms (medians of 8, one process); a whole
step went from 352 and 350 ms to 314 and 297 (40 steps a process, alternated twice, freed memory kept in both).
The draft runs in bf16 once trained (drafts run in the target's dtype), so its logits then carry the same
rounding; everything trained (the weights, their gradients, Adam's state) and the loss stay fp32.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class _Bf16Product(torch.autograd.Function):
    """x [..., hidden] fp32 → x · Wᵀ [..., vocab] fp32 through bf16 operands (fp32 accumulation, the product
    rounded to bf16); the gradient to x the same way. W is frozen: no gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(weight)
        ctx.x_dtype = x.dtype
        return F.linear(x.to(torch.bfloat16), weight).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (weight,) = ctx.saved_tensors
        return (grad.to(torch.bfloat16) @ weight).to(ctx.x_dtype), None


class Bf16FrozenLinear(nn.Module):
    """A frozen bias-free `nn.Linear` whose products run in bf16 (a bf16 copy of its weight, made once)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.bias is not None or linear.weight.requires_grad:
            raise ValueError("only a frozen, bias-free linear runs in bf16 here")
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16).contiguous(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return _Bf16Product.apply(x, self.weight)


@contextmanager
def lm_head_dtype(model: nn.Module, dtype: str) -> Iterator[None]:
    """`model.lm_head` runs in `dtype` ("float32": unchanged; "bfloat16": `Bf16FrozenLinear`) inside the block,
    and is the model's own module again after it, whatever happens inside."""
    if dtype == "float32":
        yield
        return
    if dtype != "bfloat16":
        raise ValueError(f"lm_head dtype {dtype!r}: valid are float32, bfloat16")
    head = model.lm_head
    if not isinstance(head, nn.Linear):
        raise TypeError(f"lm_head is a {type(head).__name__}, not an nn.Linear")
    model.lm_head = Bf16FrozenLinear(head)
    try:
        yield
    finally:
        model.lm_head = head


__all__ = ["Bf16FrozenLinear", "lm_head_dtype"]
