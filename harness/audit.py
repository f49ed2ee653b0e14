"""`harness audit SUITE.yaml`: is each speculative cell of a backend lossless, on that backend?

Two checks per speculative cell (drafter, γ, policy, load as in the suite):

1. Greedy: the cell at temperature 0 and plain decoding at temperature 0 on the same prompts must
   produce the same tokens, request by request; the first divergence is reported.
2. Sampled: every token the speculative cell emits at temperature T (the cell's, or 1 for
   greedy cells) gets a randomised probability integral transform u = F(x⁻) + V·p(x) under the
   target's own distribution p(·|prefix) at T (from the backend's `score_tokens`; a server backend,
   whose API exposes at most a top-k of logprobs, is scored with the target loaded here through Hugging
   Face — another engine's float noise is far below what the test can see), tokens ordered by
   descending probability. Tokens that follow p exactly give u i.i.d. uniform on [0, 1) — whatever the
   prefix, by the chain rule — so a χ² test of u over equal-width bins tests the whole output
   distribution at once, with every emitted token as a sample. Ordering by probability makes the test most sensitive to the usual failure of a
   wrong verifier: too much mass on the target's likely tokens.

The audit fails (exit 1) on any greedy mismatch or a p-value below `ALPHA` = 0.01 (a lossless backend
fails a cell by chance once in 100 audits).

Size and test by measured power (`harness.audit_power`): four classic lossy verifiers (wrong
temperature, accept-all, accept iff u < p ignoring q, resample from p instead of the residual) plugged
into the real engine in place of the verifier, a large pool of scored requests each, and the detection
rate of candidate tests at candidate sizes, by resampling requests from the pool. The default sampled
check draws at least `DEFAULT_TOKENS` tokens (requests of the cell's task, as many as that takes) and
uses the test that reached ≥ 0.95 power against all four with the fewest tokens; the audit prints the
measured table (`audit_power.json`) with every run, so its power is stated, not assumed.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from contracts.cells import Cell, PolicySpec, TaskSpec

if TYPE_CHECKING:
    from contracts.backend import Backend

ALPHA = 0.01
NUM_BINS = 10
DEFAULT_TOKENS = 3000  # sampled tokens per cell: the smallest measured size with ≥ 0.95 power against all four


@dataclass(frozen=True)
class AuditFinding:
    cell: Cell
    check: str  # greedy | sampled
    passed: bool | None  # None: not checked (the backend cannot)
    detail: str


def plain_twin(cell: Cell, temperature: float) -> Cell:
    """The same requests decoded without speculation."""
    from contracts.cells import DrafterSpec

    return dataclasses.replace(cell, drafter=DrafterSpec("none", "none"), num_drafts=0, policy=PolicySpec("full"),
                               task=dataclasses.replace(cell.task, temperature=temperature))


def at_temperature(cell: Cell, temperature: float, n_samples: int | None = None) -> Cell:
    task: TaskSpec = dataclasses.replace(cell.task, temperature=temperature,
                                         n_samples=n_samples or cell.task.n_samples)
    return dataclasses.replace(cell, task=task)


def greedy_check(spec_outputs: dict[str, tuple[int, ...]], plain_outputs: dict[str, tuple[int, ...]]) -> tuple[bool, str]:
    """Token-for-token equality per prompt key; the detail names the first divergence."""
    missing = sorted(set(plain_outputs) ^ set(spec_outputs))
    if missing:
        return False, f"requests differ between the runs: {', '.join(missing[:5])}"
    for key in sorted(plain_outputs):
        a, b = plain_outputs[key], spec_outputs[key]
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return False, f"{key}: diverges at output token {at} (plain {a[at:at + 3]} vs speculative {b[at:at + 3]})"
    tokens = sum(len(v) for v in plain_outputs.values())
    return True, f"{len(plain_outputs)} requests, {tokens} tokens identical to plain decoding"


def pit_values(probs, tokens: Sequence[int], uniforms: Sequence[float]) -> list[float]:
    """Randomised PIT of each token under its row of `probs` [N, vocab], tokens ordered by descending
    probability (ties by token id): u = P(X ranked before x) + V·p(x)."""
    import torch

    probs = torch.as_tensor(probs, dtype=torch.float64)
    tok = torch.as_tensor(list(tokens), dtype=torch.long)[:, None]
    p = probs.gather(1, tok)  # [N, 1]
    ids = torch.arange(probs.shape[1])[None, :]
    before = (probs > p) | ((probs == p) & (ids < tok))
    u = (probs * before).sum(1) + torch.as_tensor(list(uniforms), dtype=torch.float64) * p[:, 0]
    return u.clamp(0.0, math.nextafter(1.0, 0.0)).tolist()


def chi_square_uniform(values: Sequence[float], num_bins: int = NUM_BINS) -> tuple[float, float]:
    """(statistic, p-value) of Pearson's χ² that `values` are uniform on [0, 1), `num_bins` equal bins."""
    import torch

    n = len(values)
    if n < 5 * num_bins:
        raise ValueError(f"{n} values are too few for a χ² test over {num_bins} bins (need ≥ {5 * num_bins})")
    counts = [0] * num_bins
    for u in values:
        counts[min(int(u * num_bins), num_bins - 1)] += 1
    expected = n / num_bins
    stat = sum((c - expected) ** 2 / expected for c in counts)
    dof = num_bins - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, p


def anderson_darling_uniform(values: Sequence[float]) -> tuple[float, float]:
    """(A², p-value) of the Anderson-Darling test that `values` are uniform on [0, 1): a CDF test like
    Kolmogorov-Smirnov, weighted towards the tails, where a lossy verifier moves PIT mass (the
    probability ranks' extremes). p from Marsaglia & Marsaglia's (2004) approximation of the limiting
    distribution, accurate to a few 1e-6 for the sample sizes the audit uses (hundreds of values up)."""
    n = len(values)
    if n < 10:
        raise ValueError(f"{n} values are too few for an Anderson-Darling test (need ≥ 10)")
    tiny = 1e-300
    xs = sorted(min(max(u, tiny), 1.0 - 1e-16) for u in values)
    total = sum((2 * i + 1) * (math.log(xs[i]) + math.log1p(-xs[n - 1 - i])) for i in range(n))
    a2 = -n - total / n
    return a2, 1.0 - _ad_limit_cdf(a2)


def _ad_limit_cdf(z: float) -> float:
    """P(A² ≤ z) of the limiting Anderson-Darling distribution (Marsaglia & Marsaglia 2004, `adinf`)."""
    if z <= 0:
        return 0.0
    if z < 2:
        return math.exp(-1.2337141 / z) / math.sqrt(z) * (
            2.00012 + (0.247105 - (0.0649821 - (0.0347962 - (0.011672 - 0.00168691 * z) * z) * z) * z) * z)
    return math.exp(-math.exp(1.0776 - (2.30695 - (0.43424 - (0.082433 - (0.008056 - 0.0003146 * z) * z) * z) * z) * z))


def ks_uniform(values: Sequence[float]) -> tuple[float, float]:
    """(D, p-value) of the one-sample Kolmogorov-Smirnov test that `values` are uniform on [0, 1)
    (Stephens' finite-n correction of the asymptotic Kolmogorov distribution)."""
    n = len(values)
    if n < 10:
        raise ValueError(f"{n} values are too few for a Kolmogorov-Smirnov test (need ≥ 10)")
    xs = sorted(values)
    d = max(max((i + 1) / n - x, x - i / n) for i, x in enumerate(xs))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(1.0, max(0.0, p))


def pit_test(values: Sequence[float]) -> tuple[float, float]:
    """The sampled check's test of uniform PIT values, (statistic, p): Anderson-Darling, the most powerful
    of the candidates against every broken verifier at every size measured (audit_power.json)."""
    return anderson_darling_uniform(values)


PIT_TEST = "Anderson-Darling"
PIT_TEST_KEY = "anderson_darling"  # its rows in audit_power.json


def power_line() -> str:
    """What the sampled check can catch at its default size, as measured (`python3 -m harness.audit_power`)."""
    import json

    from harness.audit_power import POWER_FILE

    try:
        table = json.loads(POWER_FILE.read_text())
        at = table["sizes"].index(DEFAULT_TOKENS)
        rows = dict(table["tests"][PIT_TEST_KEY])
    except (OSError, ValueError, KeyError):
        return f"sampled check: {PIT_TEST}, ≥ {DEFAULT_TOKENS} tokens per cell, α={ALPHA:g}; power not measured"
    lossless = rows.pop("lossless", None)
    powers = ", ".join(f"{bug} {p[at]:.2f}" for bug, p in rows.items())
    alarms = f"; false alarms (lossless) {lossless[at]:.3f}" if lossless else ""
    return (f"sampled check: {PIT_TEST}, ≥ {DEFAULT_TOKENS} tokens per cell, α={ALPHA:g}; measured power at that "
            f"size ({table['cell']}, {table['trials']} resampled audits): {powers}{alarms}")


def default_requests(cell: Cell, tokens: int = DEFAULT_TOKENS) -> int:
    """Requests of `cell`'s task that emit ≥ `tokens` tokens if most run to max_new_tokens (an upper bound of
    what one request emits), with a margin for those that stop early; never fewer than the suite's."""
    per_request = max(1, cell.task.max_new_tokens) * (2 if cell.task.multi_turn and cell.task.name == "mt_bench" else 1)
    return max(cell.task.n_samples, math.ceil(1.3 * tokens / per_request))


class LocalScorer:
    """`score_tokens` for backends that cannot score (servers): the target loaded in this process, as the
    in-house backend loads it (a local directory, or a hub id when online)."""

    def __init__(self) -> None:
        self._backend: Any = None  # the in-house backend, loaded at the first call

    def __call__(self, cell: Cell, prompt_ids, output_ids, temperature: float):
        if self._backend is None:
            from backends.inhouse.adapter import InhouseBackend

            self._backend = InhouseBackend()
        return self._backend.score_tokens(dataclasses.replace(cell, backend="inhouse"), prompt_ids, output_ids,
                                          temperature)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()


def run_audit(suite_path, only: Sequence[str] = (), samples: int | None = None, out=None) -> int:
    from contracts.backend import get_backend
    from harness.runner import load_cells

    out = out if out is not None else sys.stdout
    suite, cells = load_cells(suite_path, only)
    for cell in (c for c in cells if c.is_synthetic):
        print(f"REFUSED {cell.label()}: synthetic acceptance is not lossless by construction (it measures engine "
              "speed at a fixed acceptance); not audited, never reported as lossless", file=out)
    speculative = [c for c in cells if not c.is_plain and not c.is_synthetic]
    if not speculative:
        print("no speculative cells to audit", file=out)
        return 0
    print(power_line(), file=out)
    backends: dict[str, Backend] = {}
    scorer = LocalScorer()
    plain_cache: dict[str, dict[str, tuple[int, ...]]] = {}
    findings: list[AuditFinding] = []
    try:
        for cell in speculative:
            if cell.backend not in backends:
                backends[cell.backend] = get_backend(cell.backend, **dict(suite.backend_options.get(cell.backend, {})))
            backend = backends[cell.backend]
            findings += audit_cell(backend, cell, plain_cache, samples, scorer)
            for f in findings[-2:]:
                status = "skip" if f.passed is None else ("ok" if f.passed else "FAIL")
                print(f"{status:4s} {f.check:7s} {f.cell.label()}: {f.detail}", file=out, flush=True)
    finally:
        for backend in backends.values():
            backend.close()
        scorer.close()
    failed = [f for f in findings if f.passed is False]
    print(f"audit: {len(findings) - len(failed)} checks passed or skipped, {len(failed)} failed", file=out)
    return 1 if failed else 0


def audit_cell(backend, cell: Cell, plain_cache: dict, samples: int | None,
               scorer: LocalScorer | None = None) -> list[AuditFinding]:
    """Both checks for one speculative cell; plain runs are shared between cells with the same requests.
    `scorer` scores the tokens of a backend without `score_tokens` (None: such cells skip the sampled check)."""
    def outputs(c: Cell) -> dict[str, tuple[int, ...]]:
        result = backend.run_cell(c)
        return {r.prompt_key: r.output_ids for r in result.requests}

    plain = plain_twin(cell, 0.0)
    if plain.cell_id not in plain_cache:
        plain_cache[plain.cell_id] = outputs(plain)
    ok, detail = greedy_check(outputs(at_temperature(cell, 0.0)), plain_cache[plain.cell_id])
    found = [AuditFinding(cell, "greedy", ok, detail)]

    temperature = cell.task.temperature if cell.task.temperature > 0 else 1.0
    score = getattr(backend, "score_tokens", None) or scorer
    if score is None:
        found.append(AuditFinding(cell, "sampled", None, f"backend {cell.backend!r} cannot score tokens with the target"))
        return found
    sampled = at_temperature(cell, temperature, samples or default_requests(cell))
    result = backend.run_cell(sampled)
    import random

    rng = random.Random(int(cell.cell_id, 16))
    values: list[float] = []
    for r in result.requests:
        if not r.output_ids or not r.prompt_ids:  # nothing emitted, or a chat request whose prompt ids are unknown
            continue
        probs = score(sampled, r.prompt_ids, r.output_ids, temperature)  # [len(output), vocab]
        values += pit_values(probs, r.output_ids, [rng.random() for _ in r.output_ids])
    try:
        stat, p = pit_test(values)
    except ValueError as exc:
        found.append(AuditFinding(cell, "sampled", None, str(exc)))
        return found
    short = f"; fewer than the {DEFAULT_TOKENS} tokens the power was measured at" if len(values) < DEFAULT_TOKENS else ""
    found.append(AuditFinding(cell, "sampled", p >= ALPHA, f"T={temperature:g}: {len(values)} tokens, {PIT_TEST}: "
                                                           f"statistic {stat:.1f}, p={p:.3g}{short}"))
    return found
