"""The whole draft → schedule → verify loop with the kernels switched on (DSPARK_KERNELS=triton; the
interpreter on CPU) emits exactly what it emits on the torch twins: greedy and sampled, with the Markov
head kernel, the rejection kernel, the varlen attention inside the target (switched on by `TargetModel`
itself) and the prefix scheduler kernel (called by `PrefixScheduler` itself).

Equal tokens, seed for seed, imply that the losslessness results (greedy = plain decoding, χ² against the
exact law) carry over to the kernels; tests/dspark_core/test_losslessness.py itself also runs with
`TRITON_INTERPRET=1 DSPARK_KERNELS=triton` (slowly: its χ² batches are 20,000 requests, one interpreter
program each).
"""

from __future__ import annotations

import functools

import pytest
import torch

from dspark_core.drafters import as_drafter, build_draft_model, draft_config_for
from dspark_core.generate import GenerationConfig, generate
from dspark_core.scheduler import PrefixScheduler
from dspark_core.costs import step_sps_table
from dspark_core.target import TargetModel

from .conftest import DEVICE

pytest.importorskip("triton")

PROMPTS = [[5, 17, 33, 2, 40], [71], [9, 9, 12, 60, 61, 62, 3, 8]]


def _drafter(target: TargetModel):
    """A DSpark draft with a bigram Markov head (W1 = I, W2 one-hot on the target's next token after a), so
    drafts are often accepted, and a random confidence head. `target` on SDPA: the bigram is a batch of 96."""
    vocab = target.vocab_size
    config = draft_config_for(target, "dspark", mask_token_id=vocab - 1, num_layers=1, markov_rank=vocab)
    torch.manual_seed(0)
    model = build_draft_model(config).to(DEVICE)
    with torch.no_grad():
        bigram = target.model(input_ids=torch.arange(vocab, device=DEVICE)[:, None]).logits[:, -1].argmax(-1)
        model.markov_head.markov_w1.weight.copy_(torch.eye(vocab))
        model.markov_head.markov_w2.weight.zero_()
        model.markov_head.markov_w2.weight[bigram, torch.arange(vocab)] = 6.0
        model.confidence_head.proj.weight.normal_(0, 0.5)
    return as_drafter(model.eval())


def _run(monkeypatch, new_qwen3, mode: str, temperature: float, gamma=3, scheduler=False, prompts=PROMPTS):
    monkeypatch.setenv("DSPARK_KERNELS", mode)
    target = TargetModel(new_qwen3())
    assert target.varlen_attention == (mode == "triton")
    assert target.model.config._attn_implementation == ("dspark_varlen" if mode == "triton" else "dspark_sdpa")
    drafter = _drafter(target)
    policy = None
    if scheduler:
        policy = PrefixScheduler(step_sps_table(64, 2, base_latency_s=0.010, tile_latency_s=0.002))
    config = GenerationConfig(max_new_tokens=9, num_drafts=gamma, temperature=temperature)
    results = generate(target, drafter, prompts, config, seed=3, policy=policy)
    return [(r.output_ids, r.counters.num_verified, r.counters.num_accepted) for r in results]


def _count_kernel_calls(monkeypatch) -> dict[str, int]:
    """Counts calls of each Triton entry point, so a test knows the loop went through all four kernels."""
    from dspark_core.kernels import attention, markov_draft, prefix_scheduler, rejection

    calls: dict[str, int] = {}
    for module, name in [(markov_draft, "markov_draft"), (rejection, "rejection_greedy_sample_triton"),
                         (attention, "varlen_attention_triton"), (prefix_scheduler, "schedule_prefix_triton")]:
        calls[name] = 0
        original = getattr(module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_kernels_on_equals_off(triton_kernels, monkeypatch, new_qwen3, temperature: float):
    on, off = _run(monkeypatch, new_qwen3, "triton", temperature), _run(monkeypatch, new_qwen3, "torch", temperature)
    assert on == off
    assert sum(sum(a) for _, _, a in off) > 0, "some drafts should be accepted"


def test_everything_on_greedy(triton_kernels, monkeypatch, new_qwen3):
    """Markov head, prefix scheduler, varlen attention and rejection kernels together, γ = 5."""
    run = functools.partial(_run, monkeypatch, new_qwen3, gamma=5)
    calls = _count_kernel_calls(monkeypatch)
    on = run("triton", 0.0, scheduler=True)
    assert all(calls[name] > 0 for name in calls), calls  # each kernel really ran inside the loop
    off = run("torch", 0.0, scheduler=True)
    assert on == off
    plain = run("torch", 0.0)
    assert [o for o, _, _ in on] == [o for o, _, _ in plain], "greedy output does not depend on the policy"
