"""The draft's inference fast paths compute the numbers of its plain path.

- `DSparkModel.sample_block` (every sequential head) draws each position from `head_outputs`' logits at the token
  drawn before it, and its confidence logits are `head_outputs`' too, although they are computed once over the
  block: checked against teacher forcing on the drawn tokens (the per-position path training takes).
- In bf16 on the CPU the draft layers' norms, rotary and SiLU·up run as C++ calls (`layers.pointwise`); their
  outputs stay within bf16 rounding of the eager ops' (`DSPARK_KERNELS=torch`), and training never takes them.
"""

from __future__ import annotations

import pytest
import torch

from dspark_core.drafters import build_draft_model, draft_config_for
from dspark_core.drafters.layers import pointwise
from dspark_core.kernels import decoder_pointwise_cpu

MASK = 95


def _model(target, dtype: torch.dtype = torch.float32, head: str = "markov"):
    config = draft_config_for(target, "dspark", mask_token_id=MASK, head=head, num_layers=2, target_layer_ids=(0, 2),
                              markov_rank=8, draft_vocab_size=48)
    torch.manual_seed(0)
    model = build_draft_model(config)
    model.set_draft_vocabulary(torch.randperm(config.vocab_size, generator=torch.Generator().manual_seed(2))[:48])
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.5 * torch.randn_like(p))
    return model.to(dtype).eval()


@pytest.mark.parametrize("head", ["markov", "gated", "rnn"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_block_draws_from_head_outputs_at_the_drawn_tokens(qwen3_target, temperature: float, head: str):
    model = _model(qwen3_target, head=head)
    gen = torch.Generator().manual_seed(3)
    rows, n = 4, 6
    h = torch.randn(rows, n, model.config.hidden_size, generator=gen)
    anchors = torch.randint(0, model.config.vocab_size, (rows,), generator=gen)
    uniforms = torch.rand(rows, n, generator=gen)
    with torch.no_grad():
        tokens, probs, conf = model.sample_block(h, anchors, torch.full((rows,), temperature), uniforms)
        prev = torch.cat([anchors[:, None], tokens[:, :-1]], dim=1)
        logits, conf_forced = model.teacher_forced(h, prev)  # [rows, n, draft vocab]
    assert conf is not None and conf_forced is not None
    torch.testing.assert_close(conf, conf_forced)
    if temperature == 0.0:
        assert probs is None
        assert torch.equal(tokens, model.to_target_ids(logits.max(-1).indices))
    else:
        assert probs is not None
        expected = model.full_vocab_probs(torch.softmax(logits / temperature, dim=-1))
        torch.testing.assert_close(probs, expected)
        assert bool((probs.gather(-1, tokens[..., None]) > 0).all())  # each token drawn from its own law
    assert len(set(tokens.flatten().tolist())) >= 4  # varied drafts: a constant block would prove little


@pytest.mark.skipif(not decoder_pointwise_cpu.ready(torch.bfloat16, torch.device("cpu")),
                    reason="the C++ elementwise kernels do not run here (no compiler or no AVX512-BF16)")
def test_bf16_draft_layers_take_the_cpu_kernels_within_bf16_rounding(qwen3_target, monkeypatch):
    model = _model(qwen3_target, torch.bfloat16)
    gen = torch.Generator().manual_seed(4)
    rows, ctx, n = 2, 9, 5
    c = model.config
    features = torch.randn(rows, ctx, c.num_target_features * c.target_hidden_size, generator=gen).bfloat16()
    block = torch.randint(0, c.vocab_size, (rows, n), generator=gen)
    positions = torch.arange(ctx + n).expand(rows, -1)
    mask = torch.ones(rows, n, ctx + n, dtype=torch.bool)

    def backbone() -> torch.Tensor:
        with torch.no_grad():
            kv = model.context_kv(model.fuse(features), positions[:, :ctx])
            return model.backbone(block, positions[:, ctx:], kv, mask).float()

    x = torch.zeros(1, c.hidden_size, dtype=torch.bfloat16)
    with torch.no_grad():
        assert pointwise(x, model.norm.weight)
    assert not pointwise(x, model.norm.weight)  # gradients on: training keeps the eager ops
    calls: dict[str, int] = {}
    for name in ("add_rms_norm", "rope", "silu_mul"):  # spies: the real calls, counted
        real = getattr(decoder_pointwise_cpu, name)
        monkeypatch.setattr(decoder_pointwise_cpu, name,
                            lambda *a, _real=real, _name=name, **k: calls.update({_name: calls.get(_name, 0) + 1})
                            or _real(*a, **k))
    fused = backbone()
    # per layer: context k norm + rope; input, q, k, post norms, two ropes, SiLU·up; then the final and hidden norms
    assert calls == {"add_rms_norm": 2 * (1 + 4) + 2, "rope": 2 * (1 + 2), "silu_mul": 2}
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    with torch.no_grad():
        assert not pointwise(x, model.norm.weight)
    eager = backbone()
    scale = eager.abs().amax(-1, keepdim=True)
    assert float(((fused - eager).abs() / scale).max()) < 2 ** -5  # a few bf16 roundings through two layers
    assert float(torch.nn.functional.cosine_similarity(fused.flatten(), eager.flatten(), dim=0)) > 0.9999



def test_the_rotary_made_from_cached_frequencies_is_the_formula():
    """`rotary` keeps θ^(−2i/d) per (d, θ, device) rather than making it at every call: the same cos and sin."""
    from dspark_core.drafters.layers import rotary

    positions = torch.tensor([[0, 5, 17], [3, 4, 1000]])
    for head_dim, theta in ((64, 100_000.0), (8, 10_000.0)):
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        emb = torch.cat([positions[..., None].float() * inv_freq] * 2, dim=-1)
        for _ in range(2):  # made, then read back
            cos, sin = rotary(positions, head_dim, theta)
            assert torch.equal(cos, emb.cos()) and torch.equal(sin, emb.sin())
