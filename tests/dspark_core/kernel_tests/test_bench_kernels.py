"""Micro-benchmarks (CUDA only): each kernel against its torch twin at Qwen3-8B sizes, with the bytes each
call must move and the bandwidth achieved, against the device's peak (a measured device-to-device copy, and
the datasheet figure where the device is known).

    python -m pytest tests/dspark_core/kernel_tests/test_bench_kernels.py --benchmark-enable \\
        --benchmark-json=gpu_kernels.json          # then: harness ingest gpu_kernels.json

`extra_info` of every benchmark: impl (triton | torch), bytes (the minimum traffic of the kernel's design:
every operand read once per pass it needs), achieved_GBps = bytes / mean time, peak_GBps (measured copy),
datasheet_GBps, fraction_of_peak. Without --benchmark-enable each case runs once, as a smoke test.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

VOCAB, HIDDEN, RANK, GAMMA = 151_936, 4096, 256, 7  # Qwen3-8B's vocabulary and width, DSpark's r and γ
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
DATASHEET_GBPS = {"H200": 4800.0, "H100 80GB HBM3": 3350.0, "H100 PCIe": 2000.0, "A100-SXM4-80GB": 2039.0,
                  "A100-SXM4-40GB": 1555.0, "L40S": 864.0, "A10G": 600.0}


@pytest.fixture(autouse=True)
def _needs_triton():
    pytest.importorskip("triton")


@lru_cache(maxsize=None)
def measured_peak_gbps() -> float:
    """Device-to-device copy of 1 GiB: read + write bytes over the best of 10."""
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y.copy_(x)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del x, y
    return 2 * 2**30 / best / 1e9


def _datasheet() -> float | None:
    name = torch.cuda.get_device_name()
    return next((v for k, v in DATASHEET_GBPS.items() if k in name), None)


def _bench(benchmark, fn, impl: str, num_bytes: int | None, rounds: int = 20):
    def run():
        fn()
        torch.cuda.synchronize()

    benchmark.extra_info.update(impl=impl, device=torch.cuda.get_device_name())
    benchmark.pedantic(run, rounds=rounds, warmup_rounds=3, iterations=1)
    if num_bytes is not None and benchmark.stats is not None:
        mean = benchmark.stats.stats.mean
        peak = measured_peak_gbps()
        achieved = num_bytes / mean / 1e9
        benchmark.extra_info.update(
            bytes=num_bytes, achieved_GBps=round(achieved, 1), peak_GBps=round(peak, 1), datasheet_GBps=_datasheet(),
            fraction_of_peak=round(achieved / peak, 3),
        )


def _use(monkeypatch, impl: str) -> None:
    monkeypatch.setenv("DSPARK_KERNELS", "triton" if impl == "triton" else "torch")


# --------------------------------------------------------------------------- 1. Markov-head drafting


@lru_cache(maxsize=1)
def _draft_model():
    from dspark_core.drafters.config import DraftConfig
    from dspark_core.drafters.dspark import DSparkModel

    config = DraftConfig(
        method="dspark", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_layers=1,
        num_attention_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, target_hidden_size=HIDDEN,
        target_layer_ids=(1,), mask_token_id=VOCAB - 1, markov_rank=RANK,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = DSparkModel(config)
    with torch.no_grad():
        model.markov_head.markov_w2.weight.normal_(0, 0.02)
    return model.to(torch.bfloat16).eval()


@pytest.mark.parametrize("num_rows", [1, 16, 64])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_bench_markov_draft(benchmark, monkeypatch, impl: str, num_rows: int):
    from dspark_core.drafters.dspark import draft_block

    _use(monkeypatch, impl)
    model = _draft_model()
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(num_rows, GAMMA, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    anchors = torch.randint(0, VOCAB, (num_rows,), device="cuda", generator=g)
    temps = torch.ones(num_rows, device="cuda")
    uniforms = torch.rand(num_rows, GAMMA, device="cuda", generator=g)
    block_r = max(16, min(64, 1 << (num_rows - 1).bit_length()))  # as markov_draft picks it
    row_blocks = -(-num_rows // block_r)
    num_bytes = (
        VOCAB * HIDDEN * 2  # lm_head (U for the whole block, one GEMM, in both paths)
        + GAMMA * row_blocks * VOCAB * RANK * 2  # W2 per position and block of requests
        + num_rows * GAMMA * VOCAB * (2 + 2 + 4 * 4)  # U write+read, scaled write, then read, write, read (probs)
    )
    with torch.no_grad():
        _bench(benchmark, lambda: draft_block(model, h, anchors, temps, uniforms), impl, num_bytes)


# --------------------------------------------------------------------------- 2. rejection sampling


def _verify_batch(num_rows: int):
    from dspark_core.distributions import logits_to_probs

    g = torch.Generator(device="cuda").manual_seed(0)
    total = num_rows * GAMMA
    cu = torch.arange(num_rows + 1, device="cuda") * GAMMA
    target_logits = torch.randn(total + num_rows, VOCAB, device="cuda", generator=g) * 3
    draft_logits = torch.randn(total, VOCAB, device="cuda", generator=g) * 3
    draft_probs = logits_to_probs(draft_logits, torch.ones(total, device="cuda"))
    draft_ids = torch.multinomial(draft_probs, 1, generator=g).squeeze(1)
    return (target_logits, draft_ids, cu, draft_probs, torch.ones(num_rows, device="cuda"),
            torch.rand(total, device="cuda", generator=g), torch.rand(num_rows, device="cuda", generator=g))


@pytest.mark.parametrize("num_rows", [1, 16, 64])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_bench_rejection_sample(benchmark, monkeypatch, impl: str, num_rows: int):
    from dspark_core.verification import dispatch_rejection_sample as rejection_sample

    _use(monkeypatch, impl)
    args = _verify_batch(num_rows)
    num_bytes = (num_rows * (GAMMA + 1)) * VOCAB * 4 + num_rows * VOCAB * 4 * 6  # stats pass; final row ≤ 6 passes
    _bench(benchmark, lambda: rejection_sample(*args), impl, num_bytes)


@pytest.mark.parametrize("num_rows", [16, 64])
def test_bench_rejection_greedy(benchmark, monkeypatch, num_rows: int):
    from dspark_core.verification import dispatch_rejection_sample as rejection_sample

    _use(monkeypatch, "triton")
    args = list(_verify_batch(num_rows))
    args[4] = torch.zeros(num_rows, device="cuda")
    _bench(benchmark, lambda: rejection_sample(*args, all_greedy=True), "triton", num_rows * (GAMMA + 1) * VOCAB * 4)


# --------------------------------------------------------------------------- 3. varlen attention


@pytest.mark.parametrize("context", [512, 4096])
@pytest.mark.parametrize("num_rows", [1, 16, 64])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_bench_varlen_attention(benchmark, monkeypatch, impl: str, num_rows: int, context: int):
    from dspark_core.kernels.attention_ref import varlen_attention

    _use(monkeypatch, impl)
    g = torch.Generator(device="cuda").manual_seed(0)
    num_q = GAMMA + 1
    k_cache = torch.randn(num_rows, KV_HEADS, context + num_q, HEAD_DIM, device="cuda", generator=g).bfloat16()
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(num_rows * num_q, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    cu = torch.arange(num_rows + 1, device="cuda") * num_q
    past = torch.full((num_rows,), context, device="cuda")
    num_bytes = 2 * num_rows * KV_HEADS * (context + num_q) * HEAD_DIM * 2 + 2 * q.numel() * 2
    _bench(benchmark, lambda: varlen_attention(q, k_cache, v_cache, cu, past, HEAD_DIM**-0.5, max_seqlen_q=num_q),
           impl, num_bytes)


# --------------------------------------------------------------------------- 4. prefix scheduler


@pytest.mark.parametrize("num_rows", [16, 256])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_bench_schedule_prefix(benchmark, monkeypatch, impl: str, num_rows: int):
    from dspark_core.scheduler import dispatch_schedule_prefix as schedule_prefix
    from dspark_core.costs import step_sps_table

    _use(monkeypatch, impl)
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(num_rows, GAMMA, device="cuda", generator=g, dtype=torch.float64) + 2
    survival = torch.cumprod(torch.sigmoid(logits), dim=1)
    sps = step_sps_table(4096, 64, base_latency_s=0.02, tile_latency_s=0.0005)
    schedule_prefix(survival, sps)  # builds the SPS table's dense copy on the device once
    _bench(benchmark, lambda: schedule_prefix(survival, sps), impl, None, rounds=50)
