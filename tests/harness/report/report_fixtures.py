"""Synthetic runs for the report tests, recorded through the real store (as tests/harness/store does):
cells built from hand-made RequestRecords and StepRecords, metrics from `harness.metrics.summarise`, so
every view the report reads is filled the way a real run fills it — with no model.

A speculative cell's quality is `accept`: the chance that each draft of a step is accepted (a run from
the first draft), so τ rises with it and with γ; concurrency overlaps requests, so throughput rises
with load while per-user speed falls.
"""

from __future__ import annotations

import datetime as dt
import math
import random

from contracts.cells import (
    CalibrationBin,
    Cell,
    CellResult,
    DrafterSpec,
    PolicySpec,
    RequestResult,
    TargetSpec,
    TaskSpec,
)
from harness.metrics import MeasurementWindow, RequestRecord, StepRecord, summarise
from harness.metrics.confidence import reliability_bins
from harness.store import RunInfo, Store, new_run_id

T0 = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def make_cell(drafter: str = "dspark", gamma: int = 4, *, concurrency: int | None = 1, policy: str = "full",
              task: str = "gsm8k", temperature: float = 0.0, rate: float | None = None) -> Cell:
    method = "none" if drafter == "plain" else drafter
    return Cell(
        backend="inhouse",
        target=TargetSpec("tiny", "embedded"),
        drafter=DrafterSpec(drafter, method, checkpoint=None if method == "none" else f"models/{drafter}"),
        num_drafts=0 if method == "none" else gamma,
        task=TaskSpec(task, n_samples=8, max_new_tokens=64, temperature=temperature),
        policy=PolicySpec(policy),
        concurrency=None if rate is not None else concurrency,
        rate=rate,
    )


def make_result(seed: int, *, gamma: int = 4, accept: float = 0.6, concurrency: int = 1, confidences: bool = False,
                plain: CellResult | None = None, num_requests: int = 10) -> CellResult:
    """Requests of 6 steps each, `concurrency` at a time; every request inside the window."""
    rng = random.Random(seed)
    records = []
    step_s = 0.01 * (1 + 0.2 * concurrency)  # a bigger batch makes each step slower
    for i in range(num_requests):
        arrival = (i // concurrency) * 6 * step_s
        first = arrival + 0.005
        t, times, verified, accepted, logits = first, [first], [], [], []
        for _ in range(6):
            a = 0
            while a < gamma and rng.random() < accept:
                a += 1
            t += step_s
            verified.append(gamma)
            accepted.append(a)
            times.extend([t] * (a + 1))
            logits.append(tuple(math.log(accept / (1 - accept)) + rng.gauss(0.5, 1.0) for _ in range(gamma)))
        records.append(RequestRecord(
            request_id=f"q{i:03d}", prompt_tokens=20, output_tokens=len(times), arrival_s=arrival,
            first_token_s=first, finish_s=t, token_times_s=tuple(times), num_drafts=gamma,
            num_verified=tuple(verified), num_accepted=tuple(accepted),
            confidence_logits=tuple(logits) if confidences and gamma else (),
        ))
    window = MeasurementWindow.after_warmup(records)
    steps = [StepRecord(step=s, t_s=0.01 * (s + 1), batch_size=concurrency, num_verified=gamma * concurrency,
                        num_accepted=0, wall_s=0.01) for s in range(20)]
    temperatures = tuple(1.0 + 0.2 * j for j in range(gamma)) if confidences and gamma else None
    metrics = summarise(records, steps, window, plain=plain.metrics if plain is not None else None,
                        temperatures=temperatures)
    # the bins a real run stores: per position, from the same records as the metrics
    bins = [CalibrationBin(*row) for row in reliability_bins(records, temperatures)] if confidences and gamma else []
    requests = [RequestResult(record=r, prompt_key=f"gsm8k:{i}:0", sample_index=i, turn=0, warmup=False)
                for i, r in enumerate(records)]
    return CellResult(requests=requests, steps=steps, window=window, provenance={"device": "cpu"},
                      sts_temperatures=temperatures, metrics=metrics, calibration_bins=bins)


def run_info(suite_name: str = "cpu", **overrides) -> RunInfo:
    fields = dict(
        suite_name=suite_name, suite_path=f"suites/{suite_name}.yaml", suite_text="name: cpu\n", suite_hash="abc",
        git_sha="1234567890abcdef" * 2 + "12345678", git_branch="main", git_dirty=False, host_fingerprint="f" * 12,
        host={"cpu_model": "Test CPU", "cores": 2}, packages={"python": "3.11", "torch": "2.13.0"},
        argv=["harness", "run", f"suites/{suite_name}.yaml"],
    )
    fields.update(overrides)
    return RunInfo(**fields)


def record_run(store: Store, cells: list[tuple[Cell, CellResult | None, str | None]], *, started_at=T0,
               suite_name: str = "cpu", finish: bool = True) -> str:
    """One run of `cells` ((cell, result, error) each); returns its id."""
    run_id = store.begin_run(run_info(suite_name), run_id=new_run_id(started_at), started_at=started_at)
    for cell, result, error in cells:
        store.record_cell(run_id, cell, 0, result=result, error=error, started_at=started_at,
                          finished_at=started_at + dt.timedelta(seconds=5), comparability_key="k")
    if finish:
        store.finish_run(run_id)
    return run_id


def full_run_cells(seed: int = 0, accept: float = 0.6) -> list[tuple[Cell, CellResult | None, str | None]]:
    """Plain decoding and speculative cells at two loads: dspark (confidences) at γ 2 and 4 under the
    full and static policies, dflash (no head) at γ 4 with the scheduler; one failed cell."""
    out = []
    for concurrency in (1, 4):
        plain = make_result(seed + concurrency, gamma=0, concurrency=concurrency)
        out.append((make_cell("plain", concurrency=concurrency), plain, None))
        for gamma in (2, 4):
            for policy in ("full", "static"):
                out.append((make_cell("dspark", gamma, concurrency=concurrency, policy=policy),
                            make_result(seed + 10 * gamma + concurrency + len(policy), gamma=gamma, accept=accept,
                                        concurrency=concurrency, confidences=True, plain=plain), None))
        out.append((make_cell("dflash", 4, concurrency=concurrency, policy="scheduler"),
                    make_result(seed + 100 + concurrency, gamma=4, accept=accept - 0.2, concurrency=concurrency,
                                plain=plain), None))
    out.append((make_cell("eagle3", 4), None, "RuntimeError: <script>alert('boom')</script> & more"))
    return out
