"""`rejection_sample` against DSPARK.md §4b, on hand-built flattened batches.

Layout reminder: request r verifies n_r drafts; draft rows are flattened by `cu_num_drafts`, target
rows hold n_r + 1 positions per request (anchor, then each draft). Every test builds batches from
per-request pieces with `flatten`, so the layout is written once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy import stats

from dspark_core.distributions import GREEDY_TEMPERATURE, greedy_tokens, logits_to_probs
from dspark_core import verification
from dspark_core.verification import draw_verify_uniforms, rejection_sample, rejection_sample_greedy, verify
from exact_distribution import chi2_gof


@dataclass
class Request:
    target_logits: torch.Tensor  # [n + 1, V]
    draft_ids: list[int]  # [n]
    draft_probs: torch.Tensor | None  # [n, V]
    temperature: float
    accept_u: list[float]  # [n]
    sample_u: float


def flatten(requests: list[Request], one_hot: bool = False) -> dict:
    """Keyword arguments of `rejection_sample` for a batch (draft_probs=None if `one_hot`)."""
    num = torch.tensor([len(r.draft_ids) for r in requests])
    cu = torch.zeros(len(requests) + 1, dtype=torch.long)
    cu[1:] = num.cumsum(0)
    vocab = requests[0].target_logits.shape[-1]
    return dict(
        target_logits=torch.cat([r.target_logits for r in requests]),
        draft_token_ids=torch.tensor([x for r in requests for x in r.draft_ids], dtype=torch.long),
        cu_num_drafts=cu,
        draft_probs=None if one_hot else torch.cat(
            [r.draft_probs if r.draft_probs is not None else torch.empty(0, vocab) for r in requests]
        ),
        temperatures=torch.tensor([r.temperature for r in requests]),
        accept_uniforms=torch.tensor([u for r in requests for u in r.accept_u]),
        sample_uniforms=torch.tensor([r.sample_u for r in requests]),
    )


def run(requests: list[Request], one_hot: bool = False) -> tuple[list[int], list[int]]:
    out = rejection_sample(**flatten(requests, one_hot))
    assert out.num_accepted.dtype == torch.long and out.next_token_ids.dtype == torch.long
    assert out.num_accepted.shape == out.next_token_ids.shape == (len(requests),)
    return out.num_accepted.tolist(), out.next_token_ids.tolist()


def inverse_cdf(probs: np.ndarray, u: float) -> int:
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(probs) - 1))


def reference(r: Request, one_hot: bool = False) -> tuple[int, int]:
    """§4b written as a loop, in float64."""
    logits = r.target_logits.double()
    if r.temperature < GREEDY_TEMPERATURE:
        p_t = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double().numpy()
    else:
        p_t = torch.softmax(logits / r.temperature, -1).numpy()
    for k, x in enumerate(r.draft_ids):
        if one_hot:
            p_d = np.eye(p_t.shape[-1])[x]
        else:
            p_d = r.draft_probs[k].double().numpy()
        if r.accept_u[k] * p_d[x] < p_t[k, x]:  # u < min(1, p_t/p_d), with p_d = 0 meaning "always"
            continue
        residual = np.maximum(p_t[k] - p_d, 0.0)
        if residual.sum() <= 1e-9:
            residual = p_t[k]
        return k, inverse_cdf(residual, r.sample_u)
    n = len(r.draft_ids)
    return n, inverse_cdf(p_t[n], r.sample_u)


def logits_of(probs: list[list[float]]) -> torch.Tensor:
    """Logits whose softmax at T = 1 is `probs` (zeros become -inf)."""
    return torch.tensor(probs, dtype=torch.float64).log().float()


def random_request(
    gen: torch.Generator, vocab: int, num_drafts: int, temperature: float, greedy_run: int | None = None
) -> Request:
    """Random logits; sampled drafts, or (greedy) drafts matching the argmax for `greedy_run` positions."""
    target_logits = 2.0 * torch.randn(num_drafts + 1, vocab, generator=gen)
    draft_logits = target_logits[:num_drafts] + 1.5 * torch.randn(num_drafts, vocab, generator=gen)
    temps = torch.full((num_drafts,), temperature)
    draft_probs = logits_to_probs(draft_logits, temps)
    if num_drafts:
        draft_ids = torch.multinomial(draft_probs, 1, generator=gen).squeeze(1).tolist()
    else:
        draft_ids = []
    if temperature < GREEDY_TEMPERATURE:  # greedy drafts: match the target argmax for a random run
        run_len = int(torch.randint(0, num_drafts + 1, (), generator=gen)) if greedy_run is None else greedy_run
        argmax = target_logits.argmax(-1).tolist()
        draft_ids = [argmax[k] if k < run_len else (argmax[k] + 1) % vocab for k in range(num_drafts)]
        draft_probs = torch.nn.functional.one_hot(torch.tensor(draft_ids, dtype=torch.long), vocab).float()
    u = torch.rand(num_drafts + 1, generator=gen).tolist()
    return Request(target_logits, draft_ids, draft_probs, temperature, u[:-1], u[-1])


# ---------------------------------------------------------------------------- greedy: exact match


@pytest.mark.parametrize("one_hot", [False, True])
def test_greedy_is_exact_match(one_hot: bool):
    vocab = 7
    # Target argmax per position: 3, 1, 4, 1, 5 (clear margins).
    argmax = [3, 1, 4, 1, 5]
    logits = -torch.ones(len(argmax), vocab)
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 2.0
    # Soft draft distributions: greedy verification ignores them (and ignores the uniforms).
    draft_probs = torch.softmax(torch.randn(4, vocab, generator=torch.Generator().manual_seed(0)), -1)

    def req(n: int, drafts: list[int], u: float) -> Request:
        return Request(logits[: n + 1], drafts, draft_probs[:n], 0.0, [u] * n, u)

    cases = [
        (req(0, [], 0.3), (0, 3)),  # no drafts: the target's argmax
        (req(4, [3, 1, 4, 1], 0.999), (4, 5)),  # all accepted: bonus from the position after the last draft
        (req(4, [3, 1, 0, 1], 0.0), (2, 4)),  # first mismatch at 2: correction = argmax there
        (req(4, [0, 1, 4, 1], 0.5), (0, 3)),  # later matches after a mismatch do not count
        (req(1, [3], 0.7), (1, 1)),
        (req(3, [3, 1, 2], 0.999), (2, 4)),
    ]
    requests = [c[0] for c in cases]
    expected = [c[1] for c in cases]
    num_accepted, next_ids = run(requests, one_hot)
    assert list(zip(num_accepted, next_ids)) == expected
    for r, e in zip(requests, expected):  # alone, the same
        assert tuple(x[0] for x in run([r], one_hot)) == e


# ---------------------------------------------------------------------------- residual and one-hot paths


P_T = [0.5, 0.3, 0.2, 0.0]
P_D = [0.1, 0.6, 0.1, 0.2]


@pytest.mark.parametrize(
    "accept_u, sample_u, expected",
    [
        (0.49, 0.9, (1, 0)),  # 0.49 < p_t/p_d = 0.5: accepted; bonus from the next position (one-hot on 0)
        (0.51, 0.79, (0, 0)),  # rejected: residual max(0, p_t − p_d)/0.5 = [0.8, 0, 0.2, 0]
        (0.51, 0.81, (0, 2)),
        (0.999, 0.0, (0, 0)),
    ],
)
def test_residual(accept_u: float, sample_u: float, expected):
    r = Request(logits_of([P_T, [1, 0, 0, 0]]), [1], torch.tensor([P_D]), 1.0, [accept_u], sample_u)
    assert tuple(x[0] for x in run([r])) == expected
    assert reference(r) == expected


def test_residual_never_emits_tokens_it_has_no_mass_on():
    # Rejected at the first draft for every sample uniform: only tokens 0 and 2 can come out, 80/20.
    grid = np.linspace(0.0, 1.0, 1000, endpoint=False)
    requests = [Request(logits_of([P_T, P_T]), [1], torch.tensor([P_D]), 1.0, [0.75], float(u)) for u in grid]
    num_accepted, next_ids = run(requests)
    assert set(num_accepted) == {0}
    assert set(next_ids) == {0, 2}
    assert next_ids.count(0) == 800


def test_residual_falls_back_to_target_when_empty():
    # Draft token 3 has p_t = p_d = 0 (an inconsistent draft): u·0 < 0 fails, so it is rejected, and the
    # residual max(0, p_t − p_d) is zero everywhere because p_d = p_t. The recovered token comes from p_t.
    grid = np.linspace(0.0, 1.0, 100, endpoint=False)
    requests = [Request(logits_of([P_T, P_T]), [3], torch.tensor([P_T]), 1.0, [0.5], float(u)) for u in grid]
    num_accepted, next_ids = run(requests)
    assert set(num_accepted) == {0}
    assert next_ids == [inverse_cdf(np.array(P_T), u) for u in grid]
    assert set(next_ids) == {0, 1, 2}


def test_one_hot_drafts():
    # draft_probs=None: p_d is one-hot on the draft, so accept iff u < p_t(x), and the residual is p_t
    # with x removed.
    logits = logits_of([P_T, P_T])
    accepted = Request(logits, [1], None, 1.0, [0.29], 0.1)
    rejected = [Request(logits, [1], None, 1.0, [0.31], float(u)) for u in (0.0, 0.69, 0.72, 0.999)]
    num_accepted, next_ids = run([accepted, *rejected], one_hot=True)
    assert num_accepted == [1, 0, 0, 0, 0]
    # Residual [0.5, 0, 0.2, 0] / 0.7: u < 5/7 → 0, else 2.
    assert next_ids == [0, 0, 0, 2, 2]
    # None is the same as passing the one-hot distributions explicitly.
    explicit = [Request(r.target_logits, r.draft_ids, torch.tensor([[0.0, 1.0, 0.0, 0.0]]), 1.0, r.accept_u, r.sample_u)
                for r in [accepted, *rejected]]
    assert run(explicit) == (num_accepted, next_ids)


# ---------------------------------------------------------------------------- batching


@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_batched_equals_alone_and_reference(seed: int, one_hot: bool):
    gen = torch.Generator().manual_seed(seed)
    vocab, max_drafts = 11, 7
    lengths = [0, max_drafts, 1, 3, max_drafts, 0, 2, 5, 4, 1, 6, max_drafts]
    temps = [0.0, 1.0, 0.7, 1.3, 1.0, 0.5, 0.0, 1.0, 2.0, 1.0, 0.0, 0.9]
    requests = [random_request(gen, vocab, n, t) for n, t in zip(lengths, temps)]
    requests.append(random_request(gen, vocab, max_drafts, 0.0, greedy_run=max_drafts))  # all accepted
    lengths.append(max_drafts)
    batched = list(zip(*run(requests, one_hot)))
    alone = [tuple(x[0] for x in run([r], one_hot)) for r in requests]
    assert batched == alone
    assert batched == [reference(r, one_hot) for r in requests]
    perm = torch.randperm(len(requests), generator=gen).tolist()
    permuted = list(zip(*run([requests[i] for i in perm], one_hot)))
    assert permuted == [batched[i] for i in perm]
    # The batch exercises every outcome kind.
    assert any(a == n > 0 for (a, _), n in zip(batched, lengths))  # all accepted + bonus
    assert any(a < n for (a, _), n in zip(batched, lengths))  # a rejection


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_are_argmax_with_its_tie_rule(dtype):
    """The first maximal index, as `argmax`: a handful of values per row makes ties the rule, not the exception."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 3, (64, 4099), generator=gen).to(dtype)
    logits[5] = 1.0  # a row of one value: index 0
    assert torch.equal(greedy_tokens(logits), logits.argmax(-1)) and int(greedy_tokens(logits)[5]) == 0
    three = torch.randn(2, 3, 50, generator=gen).to(dtype)
    assert torch.equal(greedy_tokens(three), three.argmax(-1))


@pytest.mark.parametrize("seed", range(3))
def test_greedy_path_equals_the_general_rule(seed: int):
    """`rejection_sample_greedy` (argmax only) gives what the general rule gives on an all-greedy batch:
    soft or one-hot draft distributions, any uniforms, runs of matches of every length, empty requests."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [0, 7, 1, 3, 7, 0, 2, 5]
    requests = [random_request(gen, 13, n, 0.0) for n in lengths]
    requests.append(random_request(gen, 13, 7, 0.0, greedy_run=7))
    for soft in (False, True):
        if soft:  # greedy verification must ignore the draft distribution entirely
            requests = [Request(r.target_logits, r.draft_ids, torch.softmax(torch.randn(len(r.draft_ids), 13,
                        generator=gen), -1), r.temperature, r.accept_u, r.sample_u) for r in requests]
        kw = flatten(requests)
        general = rejection_sample(**kw)
        greedy = rejection_sample_greedy(kw["target_logits"], kw["draft_token_ids"], kw["cu_num_drafts"])
        assert greedy.num_accepted.tolist() == general.num_accepted.tolist()
        assert greedy.next_token_ids.tolist() == general.next_token_ids.tolist()
    assert general.num_accepted.tolist()[-1] == 7 and 0 < sum(general.num_accepted.tolist()) < sum(lengths) + 7


def test_verify_takes_the_greedy_path_only_when_every_row_is_greedy(monkeypatch):
    calls = []
    real = verification.rejection_sample_greedy
    monkeypatch.setattr(verification, "rejection_sample_greedy", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    gen = torch.Generator().manual_seed(0)
    for temps, expect in [([0.0, 0.0], 1), ([0.0, 1.0], 0)]:
        calls.clear()
        requests = [random_request(gen, 9, 3, t) for t in temps]
        kw = flatten(requests)
        verification.verify(kw["target_logits"], kw["draft_token_ids"], kw["cu_num_drafts"], kw["draft_probs"],
                            kw["temperatures"], [torch.Generator().manual_seed(i) for i in range(2)])
        assert len(calls) == expect


def test_verify_draws_per_request_streams():
    gen = torch.Generator().manual_seed(3)
    requests = [random_request(gen, 9, n, 1.0) for n in (2, 0, 5, 3)]
    kw = flatten(requests)
    num = kw["cu_num_drafts"][1:] - kw["cu_num_drafts"][:-1]

    def gens():
        return [torch.Generator().manual_seed(100 + i) for i in range(len(requests))]

    accept_u, sample_u = draw_verify_uniforms(gens(), num)
    for i, n in enumerate(num.tolist()):  # request i's numbers depend on its generator alone
        own = torch.rand(n + 1, generator=torch.Generator().manual_seed(100 + i))
        lo = int(kw["cu_num_drafts"][i])
        torch.testing.assert_close(accept_u[lo : lo + n], own[:-1])
        torch.testing.assert_close(sample_u[i], own[-1])
    kw.update(accept_uniforms=accept_u, sample_uniforms=sample_u)
    expected = rejection_sample(**kw)
    args = {k: kw[k] for k in ("target_logits", "draft_token_ids", "cu_num_drafts", "draft_probs", "temperatures")}
    got = verify(**args, generators=gens())
    assert torch.equal(got.num_accepted, expected.num_accepted)
    assert torch.equal(got.next_token_ids, expected.next_token_ids)


# ---------------------------------------------------------------------------- the statistical property

P_TARGET = np.array([0.35, 0.25, 0.15, 0.12, 0.08, 0.05])
P_DRAFT = np.array([0.05, 0.10, 0.40, 0.05, 0.30, 0.10])
ALPHA = 1e-3


def _single_step_batch(num_rows: int, one_hot_token: int | None, seed: int):
    """num_rows requests in ONE call, n_r ∈ {1, 2, 3}, every position with target p_t and draft p_d."""
    gen = torch.Generator().manual_seed(seed)
    vocab = len(P_TARGET)
    num = torch.tensor([1, 2, 3]).repeat(num_rows // 3 + 1)[:num_rows]
    cu = torch.zeros(num_rows + 1, dtype=torch.long)
    cu[1:] = num.cumsum(0)
    total = int(cu[-1])
    p_d = torch.tensor(P_DRAFT, dtype=torch.float32)
    if one_hot_token is None:
        draft_ids = torch.multinomial(p_d, total, replacement=True, generator=gen)
        draft_probs = p_d.expand(total, vocab).contiguous()
    else:
        draft_ids = torch.full((total,), one_hot_token, dtype=torch.long)
        draft_probs = None
    out = rejection_sample(
        target_logits=torch.tensor(np.log(P_TARGET), dtype=torch.float32).expand(total + num_rows, vocab),
        draft_token_ids=draft_ids,
        cu_num_drafts=cu,
        draft_probs=draft_probs,
        temperatures=torch.ones(num_rows),
        accept_uniforms=torch.rand(total, generator=gen),
        sample_uniforms=torch.rand(num_rows, generator=gen),
    )
    first_draft = draft_ids[cu[:-1]]
    first_token = torch.where(out.num_accepted >= 1, first_draft, out.next_token_ids)
    # Second emitted token of rows that accepted the first draft: draft 2 if accepted too, else the
    # recovered/bonus token (num_accepted == 1).
    second_draft = draft_ids[(cu[:-1] + 1).clamp(max=total - 1)]
    second_token = torch.where(out.num_accepted >= 2, second_draft, out.next_token_ids)
    return num, out, first_token, second_token


@pytest.mark.parametrize("one_hot_token", [None, 2, 0])
def test_first_token_is_target_distributed(one_hot_token):
    num_rows = 60_000
    num, out, first, second = _single_step_batch(num_rows, one_hot_token, seed=11)
    vocab = len(P_TARGET)
    _, _, p = chi2_gof(np.bincount(first.numpy(), minlength=vocab), P_TARGET)
    assert p > ALPHA, f"first emitted token not distributed as p_t (χ² p = {p:.2g})"
    took_first = out.num_accepted >= 1
    _, _, p = chi2_gof(np.bincount(second[took_first].numpy(), minlength=vocab), P_TARGET)
    assert p > ALPHA, f"token after an accepted draft not distributed as p_t (χ² p = {p:.2g})"

    # Acceptance of each draft = Σ min(p_t, p_d) (one-hot: p_t(x)); the accepted count is the run of
    # independent acceptances, so P(num_accepted ≥ k) = β^k for k ≤ n_r.
    if one_hot_token is None:
        beta = float(np.minimum(P_TARGET, P_DRAFT).sum())
    else:
        beta = float(P_TARGET[one_hot_token])
    for k in (1, 2, 3):
        rows = num >= k
        hits = int((out.num_accepted[rows] >= k).sum())
        p = stats.binomtest(hits, int(rows.sum()), beta**k).pvalue
        assert p > ALPHA, f"P(accepted ≥ {k}) = {hits / int(rows.sum()):.4f}, expected β^{k} = {beta**k:.4f}"
    assert bool((out.num_accepted <= num).all())
    if one_hot_token is not None:  # a rejected one-hot draft is never the recovered token
        rejected_first = out.num_accepted == 0
        assert not bool((out.next_token_ids[rejected_first] == one_hot_token).any())
