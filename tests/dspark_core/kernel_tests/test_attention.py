"""Variable-length verification attention: the Triton kernel (kernels/attention.py) against its torch twin
(kernels/attention_ref.py), and the twin — and the kernel — against Hugging Face's own attention, run inside
a tiny Qwen3 through `TargetModel.forward` over KV slots."""

from __future__ import annotations

import pytest
import torch

from dspark_core.kernels import attention_ref
from dspark_core.kernels.attention_ref import install_varlen_attention, varlen_attention, varlen_attention_torch
from dspark_core.target import TargetModel

from .conftest import DEVICE

pytest.importorskip("triton")

CASES = {  # id: (queries per request, cached lengths, heads, kv heads, head_dim)
    "one-request-one-query": ([1], [0], 2, 2, 16),
    "one-request-gamma7": ([8], [37], 4, 2, 8),
    "mixed-with-empty": ([3, 0, 8, 1], [5, 12, 0, 20], 4, 1, 16),
    "gqa-4-wide-head": ([2, 5], [17, 3], 8, 2, 32),
}


def _inputs(case: str, dtype: torch.dtype, shuffled_slots: bool, gap: bool, seed: int = 0):
    num_q, past, heads, kv_heads, head_dim = CASES[case]
    g = torch.Generator().manual_seed(seed)
    num_requests = len(num_q)
    capacity = max(p for p in past) + 8 + (9 if gap else 0)
    k_cache = torch.randn(num_requests + 1, kv_heads, capacity, head_dim, generator=g)  # one spare slot
    v_cache = torch.randn(num_requests + 1, kv_heads, capacity, head_dim, generator=g)
    q = torch.randn(sum(num_q), heads, head_dim, generator=g)
    cu = torch.zeros(num_requests + 1, dtype=torch.long)
    cu[1:] = torch.tensor(num_q).cumsum(0)
    past_t = torch.tensor(past)
    starts = past_t + 9 if gap else None  # new keys past a masked gap (target.py's attention buffers)
    slots = torch.randperm(num_requests + 1, generator=g)[:num_requests] if shuffled_slots else None
    dev = lambda t: t.to(DEVICE) if t is not None else None  # noqa: E731
    return (dev(q.to(dtype)), dev(k_cache.to(dtype)), dev(v_cache.to(dtype)), dev(cu), dev(past_t), head_dim**-0.5,
            dev(starts), dev(slots))


@pytest.mark.parametrize("layout", ["slots", "shuffled-slots-with-gap"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_kernel_matches_twin(triton_kernels, case: str, dtype: torch.dtype, layout: str):
    args = _inputs(case, dtype, shuffled_slots=layout != "slots", gap=layout != "slots")
    out = varlen_attention(*args)
    ref = varlen_attention_torch(*args)
    assert out.dtype == dtype and out.shape == args[0].shape
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(out, ref, **tol)


def test_twin_is_plain_causal_attention():
    """With nothing cached and one request, the twin is textbook causal SDPA."""
    q, k_cache, v_cache, cu, past, scale, _, _ = _inputs("one-request-gamma7", torch.float32, False, False)
    past = torch.zeros_like(past)
    n = q.shape[0]
    out = varlen_attention_torch(q, k_cache, v_cache, cu, past, scale)
    k = k_cache[0, :, :n].repeat_interleave(2, dim=0)
    v = v_cache[0, :, :n].repeat_interleave(2, dim=0)
    expected = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k, v, is_causal=True, scale=scale)
    torch.testing.assert_close(out, expected.transpose(0, 1), rtol=1e-5, atol=1e-5)


def _run_script(target: TargetModel) -> list[torch.Tensor]:
    """Prefill, verify-shaped chunks, rollback, then a subset of slots out of order (a gathered cache)."""
    g = torch.Generator().manual_seed(5)
    cache = target.new_cache(3, 32)
    outs = []

    device = target.device  # the engine's index tensors live where the cache does

    def forward(rows, lengths):
        width = max(lengths)
        tokens = torch.randint(0, target.vocab_size, (len(rows), width), generator=g).to(device)
        n = torch.tensor(lengths, device=device)
        out = target.forward(cache, torch.tensor(rows, device=device), tokens, n)
        valid = torch.arange(width, device=device)[None, :] < n[:, None]
        outs.extend([out.logits[valid], out.features[valid]])

    forward([0, 1, 2], [5, 2, 7])
    forward([0, 1, 2], [4, 8, 1])
    cache.rollback(torch.tensor([0, 1, 2], device=device), torch.tensor([6, 4, 8], device=device))
    forward([2, 0], [3, 5])
    forward([1], [1])
    return outs


@pytest.mark.parametrize("mode", ["torch", "triton"])
def test_hf_forward_through_varlen_attention_matches_sdpa(monkeypatch, new_qwen3, mode: str):
    """A tiny Qwen3 switched to "dspark_varlen" (`install_varlen_attention`) gives the logits and features
    of the same model on SDPA, through prefill, verify chunks, rollback and gathered slots."""
    if mode == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv("DSPARK_KERNELS", "torch")  # the reference: SDPA (TargetModel switches on the Triton path)
    reference = TargetModel(new_qwen3(), layer_ids=(0,))
    assert reference.config._attn_implementation in ("sdpa", "dspark_sdpa")
    monkeypatch.setenv("DSPARK_KERNELS", mode)
    calls = []
    dispatch = varlen_attention
    monkeypatch.setattr(attention_ref, "varlen_attention", lambda *a, **k: calls.append(a[0].shape) or dispatch(*a, **k))
    varlen_model = new_qwen3()
    install_varlen_attention(varlen_model)
    varlen = TargetModel(varlen_model, layer_ids=(0,))
    assert varlen.config._attn_implementation == "dspark_varlen"
    for got, want in zip(_run_script(varlen), _run_script(reference)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 4 * varlen.num_layers  # four forwards, every layer through the varlen path
