"""How big the audit's sampled check must be to catch a lossy verifier: four classic broken verifiers, and
the power of the check against each, measured on the real engine.

The broken verifiers have `dspark_core.generate.verify`'s signature, so they plug into the real engine
path in place of the verifier only (tests and the measurement patch `generate.verify`); each differs
from `dspark_core.verification.rejection_sample` in exactly one place:

    wrong_temperature   the target distribution at 0.7 × the request's temperature
    accept_all          every verified draft is accepted (no test at all)
    ignore_q            accept iff u < p(x), the draft's own probability q(x) ignored
    resample_from_p     on a rejection, the next token is drawn from p instead of the residual max(0, p − q)

Measuring power (`measure`): one large pool of sampled requests per broken verifier on the real engine,
each request scored by the target (the audit's own PIT values); the audit at a given size draws that
many tokens' worth of requests from the pool, with replacement, and the detection rate over `trials`
draws at α is the power (the bootstrap estimate of the test's rejection rate at that size). The table
the audit prints (`POWER`) is what `python3 -m harness.audit_power` measured; rerun it after changing
the drafter, the task or the test.
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
                   test=None) -> float:
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


def measure(cell, sizes: Sequence[int], samples: int = 160, trials: int = 400, temperature: float = 1.0,
            alpha: float | None = None) -> dict:
    """{"alpha", "sizes", "power": {bug: [power at each size]}, "size_lossless": [rejection rate of the
    real verifier at each size], "pool_tokens": {bug: tokens}} on the in-house engine."""
    from backends.inhouse.adapter import InhouseBackend
    from harness.audit import ALPHA

    alpha = ALPHA if alpha is None else alpha
    backend = InhouseBackend(num_threads=1)
    try:
        pools = {bug: _pool(backend, cell, bug, samples, temperature) for bug in (None, *BROKEN)}
    finally:
        backend.close()
    return {
        "alpha": alpha, "sizes": list(sizes), "trials": trials, "cell": cell.label(),
        "pool_tokens": {str(bug): sum(map(len, pool)) for bug, pool in pools.items()},
        "power": {bug: [detection_rate(pools[bug], n, alpha, trials, seed=i) for i, n in enumerate(sizes)]
                  for bug in BROKEN},
        "size_lossless": [detection_rate(pools[None], n, alpha, trials, seed=i) for i, n in enumerate(sizes)],
    }


def main(argv: Sequence[str] = ()) -> int:
    """`python3 -m harness.audit_power [SIZES…]`: measure and write `audit_power.json` beside this module."""
    from harness.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec

    sizes = [int(a) for a in argv] or [250, 500, 1000, 2000, 4000]
    cell = Cell("inhouse", TargetSpec("embedded", "embedded"), DrafterSpec("dspark", "dspark", "embedded:dspark"),
                3, TaskSpec("gsm8k", 8, 48), PolicySpec("full"), concurrency=8)
    table = measure(cell, sizes)
    POWER_FILE.write_text(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
