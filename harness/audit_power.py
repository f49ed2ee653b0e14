"""How big the audit's sampled check must be to catch a lossy verifier: four classic broken verifiers, and
the power of the check against each, measured on the real engine.

The broken verifiers have `dspark_core.generate.verify`'s signature, so they plug into the real engine
path in place of the verifier only (tests and the measurement patch `generate.verify`); each differs
from `dspark_core.verification.rejection_sample` in exactly one place:

    wrong_temperature   the target distribution at 0.7 × the request's temperature
    accept_all          every verified draft is accepted (no test at all)
    ignore_q            accept iff u < p(x), the draft's own probability q(x) ignored
    resample_from_p     on a rejection, the next token is drawn from p instead of the residual max(0, p − q)

Measuring power (`measure`): one large pool of sampled requests per verifier on the real engine (the
lossless one too, for the false-alarm rate), each request scored by the target (the audit's own PIT
values); an audit of a given size draws that many tokens' worth of whole requests from the pool, with
replacement, and the detection rate over `trials` draws at α is the power (the bootstrap estimate of
the rejection rate at that size; it runs high once the size nears the pool's, which is why the pools
are several times the sizes). `audit_power.json` is what `python3 -m harness.audit_power` measured,
for every candidate test; the audit prints its chosen test's row. Rerun it after changing the drafter,
the task or the test.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch

from dspark_core.distributions import logits_to_probs, sample_from_probs
from dspark_core.verification import VerifyOutput, _Layout, _per_target_row, draw_verify_uniforms

BROKEN = ("wrong_temperature", "accept_all", "ignore_q", "resample_from_p")
POWER_FILE = Path(__file__).with_name("audit_power.json")


def _broken_rejection(target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures, generators, *,
                      bug: str) -> VerifyOutput:
    accept_u, sample_u = draw_verify_uniforms(generators, cu_num_drafts[1:] - cu_num_drafts[:-1])
    layout = _Layout.of(cu_num_drafts, draft_token_ids.numel())
    temps = temperatures * 0.7 if bug == "wrong_temperature" else temperatures
    target_probs = logits_to_probs(target_logits, _per_target_row(temps, layout.num_drafts))
    p_target = target_probs[layout.target_row_of_draft, :].gather(1, draft_token_ids[:, None]).squeeze(1)
    p_draft = (torch.ones_like(p_target) if draft_probs is None
               else draft_probs.gather(1, draft_token_ids[:, None]).squeeze(1).float())
    if bug == "accept_all":
        accepted = torch.ones_like(p_target, dtype=torch.bool)
    elif bug == "ignore_q":
        accepted = accept_u < p_target
    else:
        accepted = accept_u * p_draft < p_target
    num_accepted = layout.num_accepted(accepted)
    final_probs = target_probs[layout.final_target_row(num_accepted)].clone()
    rejected = num_accepted < layout.num_drafts
    if bool(rejected.any()) and bug != "resample_from_p":
        row = (cu_num_drafts[:-1] + num_accepted)[rejected]
        p_d = (torch.nn.functional.one_hot(draft_token_ids[row], final_probs.shape[-1]).float()
               if draft_probs is None else draft_probs[row].float())
        residual = (final_probs[rejected] - p_d).clamp_(min=0)
        mass = residual.sum(-1, keepdim=True)
        final_probs[rejected] = torch.where(mass > 1e-9, residual / mass.clamp(min=1e-9), final_probs[rejected])
    return VerifyOutput(num_accepted, sample_from_probs(final_probs, sample_u.to(target_logits.device)))


def broken_verifier(bug: str) -> Callable:
    """A drop-in for `dspark_core.generate.verify` with one classic bug (BROKEN)."""
    if bug not in BROKEN:
        raise ValueError(f"bug must be one of {BROKEN}, got {bug!r}")

    def verify(target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures, generators):
        return _broken_rejection(target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures,
                                 generators, bug=bug)

    verify.__name__ = f"verify_{bug}"
    return verify


# ------------------------------------------------------------------------------------------- power


def detection_rate(pool: Sequence[Sequence[float]], tokens: int, alpha: float, trials: int, seed: int = 0,
                   test: Callable | None = None) -> float:
    """Share of `trials` audits of ≥ `tokens` PIT values (whole requests drawn from `pool` with
    replacement) whose test p-value is below `alpha`."""
    from harness.audit import pit_test

    test = test or pit_test
    rng = random.Random(seed)
    hits = 0
    for _ in range(trials):
        values: list[float] = []
        while len(values) < tokens:
            values += pool[rng.randrange(len(pool))]
        hits += test(values)[1] < alpha
    return hits / trials


def _pool(backend, cell, bug: str | None, samples: int, temperature: float) -> list[list[float]]:
    """PIT values per request of `samples` sampled requests of `cell` with verifier `bug` (None: the real one)."""
    import dspark_core.generate as generate
    from harness.audit import at_temperature, pit_values

    real = generate.verify
    generate.verify = real if bug is None else broken_verifier(bug)
    try:
        sampled = at_temperature(cell, temperature, samples)
        result = backend.run_cell(sampled)
    finally:
        generate.verify = real
    rng = random.Random(17)
    out = []
    for r in result.requests:
        if r.output_ids and r.prompt_ids:
            probs = backend.score_tokens(sampled, r.prompt_ids, r.output_ids, temperature)
            out.append(pit_values(probs, r.output_ids, [rng.random() for _ in r.output_ids]))
    return out


# Requests per pool: the hardest bug and the lossless verifier (whose false-alarm rate is measured too) get
# the largest pools, so that the sizes the audit needs stay a small share of the pool resampled.
POOL_REQUESTS = {"lossless": 400, "wrong_temperature": 120, "accept_all": 120, "ignore_q": 120,
                 "resample_from_p": 400}
SIZES = (1000, 2000, 3000, 4000, 5000)
CANDIDATE_TESTS = ("anderson_darling", "kolmogorov_smirnov", "chi_square_10", "chi_square_5")


def candidate_tests() -> dict[str, Callable]:
    from harness.audit import anderson_darling_uniform, chi_square_uniform, ks_uniform

    return {"anderson_darling": anderson_darling_uniform, "kolmogorov_smirnov": ks_uniform,
            "chi_square_10": lambda v: chi_square_uniform(v, 10), "chi_square_5": lambda v: chi_square_uniform(v, 5)}


def pools(cell, cache: Path | None = None, temperature: float = 1.0) -> dict[str, list[list[float]]]:
    """{verifier: PIT values per request} on the in-house engine, read from / written to `cache` (JSON)."""
    out: dict[str, list[list[float]]] = json.loads(cache.read_text()) if cache and cache.is_file() else {}
    missing = [name for name in POOL_REQUESTS if name not in out]
    if missing:
        from backends.inhouse.adapter import InhouseBackend

        backend = InhouseBackend(num_threads=1)
        try:
            for name in missing:
                bug = None if name == "lossless" else name
                out[name] = _pool(backend, cell, bug, POOL_REQUESTS[name], temperature)
                if cache:
                    cache.write_text(json.dumps(out))
        finally:
            backend.close()
    return out


def measure(cell, sizes: Sequence[int] = SIZES, trials: int = 400, cache: Path | None = None) -> dict:
    """The power table: per candidate test, per verifier (the lossless one: its false-alarm rate), the
    detection rate at each size at the audit's α."""
    from harness.audit import ALPHA

    pooled = pools(cell, cache)
    return {
        "alpha": ALPHA, "sizes": list(sizes), "trials": trials, "cell": cell.label(),
        "pool_tokens": {name: sum(map(len, pool)) for name, pool in pooled.items()},
        "tests": {name: {bug: [detection_rate(pool, n, ALPHA, trials, seed=i, test=test) for i, n in enumerate(sizes)]
                         for bug, pool in pooled.items()}
                  for name, test in candidate_tests().items()},
    }


def main(argv: Sequence[str] = ()) -> int:
    """`python3 -m harness.audit_power [POOL_CACHE.json]`: measure the candidate tests' power on the embedded
    default and write `audit_power.json` beside this module (the audit prints its chosen test's row)."""
    from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec

    cell = Cell("inhouse", TargetSpec("embedded", "embedded"), DrafterSpec("dspark", "dspark", "embedded:dspark"),
                3, TaskSpec("gsm8k", 8, 48), PolicySpec("full"), concurrency=8)
    table = measure(cell, cache=Path(argv[0]) if argv else None)
    POWER_FILE.write_text(json.dumps(table, indent=1) + "\n")
    for test, rows in table["tests"].items():
        for bug, powers in rows.items():
            print(f"{test:20s} {bug:18s} " + "  ".join(f"{n}:{p:.3f}" for n, p in zip(table["sizes"], powers)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
