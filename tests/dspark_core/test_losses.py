import math

import numpy as np
import pytest
import torch

from dspark_core.losses import CE_ONLY, LossWeights, acceptance_probability, draft_loss, position_weights


def _example(seed: int = 0, num_blocks: int = 2, num_pos: int = 3, vocab: int = 5):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_blocks, num_pos, vocab, generator=g, dtype=torch.float64) * 2
    target_logits = torch.randn(num_blocks, num_pos, vocab, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, vocab, (num_blocks, num_pos), generator=g)
    conf = torch.randn(num_blocks, num_pos, generator=g, dtype=torch.float64)
    valid = torch.ones(num_blocks, num_pos, dtype=torch.bool)
    valid[1, 2] = False  # e.g. a slot past the end of the sequence
    labels[1, 2] = 10_000  # garbage where invalid: must be ignored, not index out of range
    return logits, target_logits, labels, conf, valid


def _numpy_loss(logits, target_logits, labels, conf, valid, decay, weights):
    """Independent reference: explicit loops over blocks and positions, float64 numpy."""
    lg, tl, lb, cf, vd = (x.numpy() for x in (logits, target_logits, labels, conf, valid))
    num_blocks, num_pos, _ = lg.shape
    sums = {"ce": 0.0, "l1": 0.0, "bce": 0.0, "alpha": 0.0, "confidence": 0.0}
    w_total = 0.0
    for n in range(num_blocks):
        for k in range(num_pos):
            if not vd[n, k]:
                continue
            w = math.exp(-k / decay)
            pd = np.exp(lg[n, k] - lg[n, k].max())
            pd /= pd.sum()
            pt = np.exp(tl[n, k] - tl[n, k].max())
            pt /= pt.sum()
            l1 = np.abs(pd - pt).sum()
            alpha = min(1.0, max(0.0, 1.0 - 0.5 * l1))
            s = 1.0 / (1.0 + math.exp(-cf[n, k]))
            sums["ce"] += w * -math.log(pd[lb[n, k]])
            sums["l1"] += w * l1
            sums["bce"] += w * -(alpha * math.log(s) + (1 - alpha) * math.log(1 - s))
            sums["alpha"] += w * alpha
            sums["confidence"] += w * s
            w_total += w
    means = {name: v / w_total for name, v in sums.items()}
    means["total"] = weights.ce * means["ce"] + weights.l1 * means["l1"] + weights.bce * means["bce"]
    return means


@pytest.mark.parametrize("decay", [4.0, 1.5])
def test_loss_matches_hand_computation(decay):
    logits, target_logits, labels, conf, valid = _example()
    weights = LossWeights()  # 0.1 CE + 0.9 L1 + 1.0 BCE
    out = draft_loss(logits, labels, valid, target_logits, conf, weights=weights, decay=decay)
    ref = _numpy_loss(logits, target_logits, labels, conf, valid, decay, weights)
    assert out.ce == pytest.approx(ref["ce"], rel=1e-6)
    assert out.l1 == pytest.approx(ref["l1"], rel=1e-6)
    assert out.bce == pytest.approx(ref["bce"], rel=1e-6)
    assert out.acceptance == pytest.approx(ref["alpha"], rel=1e-6)
    assert out.confidence == pytest.approx(ref["confidence"], rel=1e-6)  # the head's promise, weighted as α is
    assert float(out.total) == pytest.approx(ref["total"], rel=1e-6)
    assert out.num_positions == 5


def test_mask_and_position_weights():
    w = position_weights(4, decay=4.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-0.25), math.exp(-0.5), math.exp(-0.75)]))
    logits, target_logits, labels, conf, valid = _example()
    # changing anything at a masked position changes nothing
    logits2, target2, conf2 = logits.clone(), target_logits.clone(), conf.clone()
    logits2[1, 2] += 7.0
    target2[1, 2] -= 3.0
    conf2[1, 2] = 9.0
    a = draft_loss(logits, labels, valid, target_logits, conf)
    b = draft_loss(logits2, labels, valid, target2, conf2)
    assert float(a.total) == pytest.approx(float(b.total), rel=1e-12)
    # nothing valid: a finite zero, not nan
    none = draft_loss(logits, labels, torch.zeros_like(valid), target_logits, conf)
    assert float(none.total) == 0.0


def test_ce_only_and_identical_distributions():
    logits, target_logits, labels, conf, valid = _example(seed=1)
    out = draft_loss(logits, labels, valid, target_logits, None, weights=CE_ONLY)
    assert float(out.total) == pytest.approx(out.ce, rel=1e-12)
    assert math.isnan(out.bce) and not math.isnan(out.l1)  # L1/α still logged
    assert math.isnan(out.confidence)  # no confidence head, no promise
    ce_alone = draft_loss(logits, labels, valid, weights=CE_ONLY)
    assert math.isnan(ce_alone.l1) and float(ce_alone.total) == pytest.approx(out.ce)
    with pytest.raises(ValueError, match="target's logits"):
        draft_loss(logits, labels, valid)  # DSpark weights need the target
    l1, alpha = acceptance_probability(torch.softmax(logits, -1), torch.softmax(logits, -1))
    assert torch.allclose(l1, torch.zeros_like(l1)) and torch.allclose(alpha, torch.ones_like(alpha))


def test_bce_label_is_detached():
    logits, target_logits, labels, conf, valid = _example(seed=2)
    logits.requires_grad_(True)
    conf.requires_grad_(True)
    out = draft_loss(logits, labels, valid, target_logits, conf, weights=LossWeights(ce=0.0, l1=0.0, bce=1.0), decay=4.0)
    out.total.backward()
    # α is a label: the BCE term must not move the draft distribution
    assert logits.grad is not None and torch.count_nonzero(logits.grad) == 0
    # d BCE / d c = w·(σ(c) − α) / Σw
    with torch.no_grad():
        _, alpha = acceptance_probability(torch.softmax(logits, -1), torch.softmax(target_logits, -1))
        w = position_weights(3, 4.0).double()[None, :] * valid
        expected = w * (torch.sigmoid(conf) - alpha) / w.sum()
    assert torch.allclose(conf.grad, expected, atol=1e-12)
    # the full loss does move the draft through CE and L1
    logits.grad = None
    draft_loss(logits, labels, valid, target_logits, conf.detach()).total.backward()
    assert torch.count_nonzero(logits.grad) > 0


def test_reduced_vocabulary_loss_is_the_whole_vocabulary_distance():
    """A draft over 4 of 7 tokens: its L1, α and BCE are those of its distribution zero-padded to the whole
    vocabulary against the target's; CE covers only the labels it can propose."""
    logits, target_logits, labels, conf, valid = _example(vocab=7, num_pos=4)
    labels[1, 2] = 3  # a valid-looking label where invalid: still ignored
    ids = torch.tensor([0, 2, 3, 6])
    to_draft = torch.full((7,), -1)
    to_draft[ids] = torch.arange(4)
    draft_labels = to_draft[labels.clamp(max=6)]
    assert bool((draft_labels == -1).any()) and bool((draft_labels >= 0).any())
    loss = draft_loss(logits[..., ids], draft_labels, valid, torch.log_softmax(target_logits, -1)[..., ids], conf,
                      target_log_probs=True)

    q = torch.zeros_like(target_logits)
    q[..., ids] = torch.softmax(logits[..., ids], -1)
    p = torch.softmax(target_logits, -1)
    l1 = (q - p).abs().sum(-1)
    alpha = (1 - l1 / 2).clamp(0, 1)
    w = position_weights(4, 4.0)[None].double() * valid
    bce = torch.nn.functional.binary_cross_entropy_with_logits(conf, alpha, reduction="none")
    ce_w = w * (draft_labels >= 0)
    ce = -torch.log(q.gather(-1, labels.clamp(max=6)[..., None]).squeeze(-1).clamp(min=1e-300))
    assert loss.l1 == pytest.approx(float((l1 * w).sum() / w.sum()), rel=1e-6)
    assert loss.acceptance == pytest.approx(float((alpha * w).sum() / w.sum()), rel=1e-6)
    assert loss.bce == pytest.approx(float((bce * w).sum() / w.sum()), rel=1e-6)
    assert loss.ce == pytest.approx(float((torch.where(ce_w > 0, ce, 0) * ce_w).sum() / ce_w.sum()), rel=1e-6)
    # alpha is also Σ min(q, p) over the whole vocabulary
    assert loss.acceptance == pytest.approx(float((torch.minimum(q, p).sum(-1) * w).sum() / w.sum()), rel=1e-6)
