"""The verification policy of an in-house engine, from the suite's `PolicySpec`, with the tables it prices by.

The table-priced policies (`scheduler`, `budget`: an SPS(B) table; `adaptive`: a step-cost table) read the
suite's file when it names one, else measure the table on this device once per target (`profile.py`) and
keep it on the loaded target for the next cells: profiling takes seconds to minutes and a run has many
cells. The note each returns ("sps profiled 1:… 2:…") is printed by the server and kept in the cell's log.
"""

from __future__ import annotations

from typing import Any

import torch

from contracts.backend import BackendError
from contracts.cells import PolicySpec

SPS_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PROFILE_CONTEXT = 256  # context length the tables are measured (and fingerprinted) at


def build_policy(spec: PolicySpec, plain: bool, num_drafts: int, target, drafter, temperatures, *,
                 drafter_key: tuple = (), rows: int = 64, offsets=None) -> tuple[Any, str]:
    """(the dspark_core policy, a note) for `spec`; None verifies every draft (plain decoding, `full`).

    `target` is a `build.LoadedTarget` (its `tables` cache what was profiled), `temperatures` the drafter's
    STS temperatures [γ] or None (`offsets`: the level offsets fitted with them, or None), `drafter_key` what
    identifies the drafter in that cache, `rows` the most requests a step decodes (the step-cost table covers
    batch sizes up to it, rounded up to a power of two)."""
    from dspark_core import scheduler

    temps = torch.tensor(temperatures[:num_drafts], dtype=torch.float64) if temperatures else None
    levels = torch.tensor(offsets[:num_drafts], dtype=torch.float64) if temps is not None and offsets else None
    if plain or spec.name == "full":
        return None, ""
    if spec.name == "static":
        if spec.verify_length is None:
            raise ValueError("policy static needs verify_length (γ' drafts verified per step)")
        return scheduler.StaticLength(spec.verify_length), ""
    if spec.name == "threshold":
        if spec.threshold is None:
            raise ValueError("policy threshold needs threshold (a confidence cut-off in (0, 1))")
        return scheduler.ConfidenceThreshold(spec.threshold, temperatures=temps, offsets=levels), ""
    if spec.name == "adaptive":
        costs, note = step_cost_table(spec, target, drafter, num_drafts, drafter_key, rows)
        return scheduler.CostAwareScheduler(costs, temperatures=temps, offsets=levels), note
    sps, note = sps_table(spec, target)
    if spec.name == "scheduler":
        return scheduler.PrefixScheduler(sps, temperatures=temps, offsets=levels), note
    if spec.name == "budget":
        return scheduler.AsyncBudgetScheduler(sps, temperatures=temps, offsets=levels), note
    raise BackendError(f"policy {spec.name!r} is not supported by the in-house backend")


def step_cost_table(spec: PolicySpec, target, drafter, num_drafts: int, drafter_key: tuple, rows: int) -> tuple[Any, str]:
    """The adaptive policy's step-cost table: from the suite's file, or profiled on this device once per
    (drafter, γ, batch sizes up to `rows` rounded up to a power of two)."""
    from backends.inhouse.profile import profile_step_costs
    from dspark_core import costs

    if spec.sps_table:
        fp = costs.fingerprint_for(target.model, PROFILE_CONTEXT)
        return costs.load_step_cost_table(spec.sps_table, fp), f"step costs {spec.sps_table}"
    top = 1 << max(0, (rows - 1).bit_length())
    sizes = tuple(1 << i for i in range(top.bit_length()))
    key = ("step_costs", *drafter_key, num_drafts, sizes)
    if key not in target.tables:
        target.tables[key] = profile_step_costs(target.model, drafter, sizes, PROFILE_CONTEXT, num_drafts=num_drafts,
                                                repeats=3).monotone()
    table = target.tables[key]
    return table, "step costs profiled " + " ".join(
        f"{r}:{1e3 * v[0]:.1f}/{1e3 * (v[-1] + d[-1]):.1f}ms" for r, v, d in zip(table.rows, table.verify_s, table.draft_s))


def sps_table(spec: PolicySpec, target) -> tuple[Any, str]:
    """The prefix schedulers' SPS(B) table: from the suite's file, or profiled on this device once per target."""
    from backends.inhouse.profile import profile_sps
    from dspark_core import costs

    if spec.sps_table:
        fp = costs.fingerprint_for(target.model, PROFILE_CONTEXT)
        return costs.load_sps_table(spec.sps_table, fp), f"sps table {spec.sps_table}"
    if PROFILE_CONTEXT not in target.tables:
        target.tables[PROFILE_CONTEXT] = profile_sps(target.model, SPS_BATCH_SIZES, PROFILE_CONTEXT, repeats=5)
    table = target.tables[PROFILE_CONTEXT]
    return table, "sps profiled " + " ".join(f"{b}:{s:.0f}" for b, s in zip(table.batch_sizes, table.steps_per_second))
