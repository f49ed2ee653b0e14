"""Hand-built cells and results for the store tests: varied verify lengths, failures, requests outside the
window, confidences — everything the views and the round trip must get right — with no model."""

from __future__ import annotations

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
from harness.store import RunInfo


def make_cell(method: str = "dspark", num_drafts: int = 4, *, concurrency: int | None = 4, rate: float | None = None,
              seed: int = 0, temperature: float = 0.0, policy: str = "full") -> Cell:
    name = "plain" if method == "none" else method
    return Cell(
        backend="inhouse",
        target=TargetSpec("tiny", "embedded"),
        drafter=DrafterSpec(name, method, checkpoint=None if method == "none" else f"models/{name}"),
        num_drafts=0 if method == "none" else num_drafts,
        task=TaskSpec("gsm8k", n_samples=8, max_new_tokens=64, temperature=temperature),
        policy=PolicySpec(policy),
        concurrency=concurrency,
        rate=rate,
        seed=seed,
    )


def make_request(rng: random.Random, rid: str, *, gamma: int, arrival: float, confidences: bool,
                 error: str | None = None, num_steps: int | None = None) -> RequestRecord:
    """A request whose counts, token times and confidences agree, verify lengths varying 0 … γ."""
    num_steps = rng.randint(1, 12) if num_steps is None else num_steps
    first = arrival + rng.uniform(0.01, 0.1)
    t = first
    times = [first]
    verified, accepted, logits = [], [], []
    for _ in range(num_steps):
        v = rng.choice([gamma, gamma, rng.randint(0, gamma)]) if gamma else 0
        a = min(v, int(rng.expovariate(0.7))) if v else 0
        t += rng.uniform(0.005, 0.02)
        verified.append(v)
        accepted.append(a)
        times.extend([t] * (a + 1))
        logits.append(tuple(rng.gauss(1.0, 2.0) for _ in range(v)))
    return RequestRecord(
        request_id=rid, prompt_tokens=rng.randint(5, 50), output_tokens=len(times), arrival_s=arrival,
        first_token_s=first, finish_s=t, token_times_s=tuple(times), num_drafts=gamma,
        num_verified=tuple(verified), num_accepted=tuple(accepted),
        confidence_logits=tuple(logits) if confidences and gamma else (),
        finish_reason="error" if error else "length", error=error,
    )


def make_result(seed: int = 0, *, gamma: int = 4, num_requests: int = 24, confidences: bool = True,
                plain: CellResult | None = None, num_steps: int | None = None) -> CellResult:
    """Requests arriving over ~2 s, two of them failed; the window starts after the first few finish and
    ends before the last, so some requests fall on each side of it."""
    rng = random.Random(seed)
    records = []
    for i in range(num_requests):
        error = "RuntimeError: boom" if i in (3, 11) else None
        records.append(make_request(rng, f"q{i:03d}", gamma=gamma, arrival=0.08 * i, confidences=confidences,
                                    error=error, num_steps=num_steps))
    finishes = sorted(r.finish_s for r in records)
    window = MeasurementWindow(finishes[2], finishes[-2])
    steps = []
    t = 0.0
    for s in range(40):
        t += 0.06
        v = rng.randint(0, 4 * gamma)
        steps.append(StepRecord(step=s, t_s=t, batch_size=4, num_verified=v, num_accepted=rng.randint(0, v),
                                wall_s=0.05 + 0.001 * s, draft_length=gamma if s % 3 else 0,
                                num_prefilled=4 if s == 0 else 0))
    temperatures = tuple(1.0 + 0.1 * j for j in range(gamma)) if confidences and gamma else None
    metrics = summarise(records, steps, window, plain=plain.metrics if plain is not None else None,
                        temperatures=temperatures)
    bins = [
        CalibrationBin(kind, position, b, b / 20, (b + 1) / 20, count=3 + b, confidence_sum=(b + 0.5) / 20 * (3 + b),
                       outcome_sum=float(b % 3))
        for kind in ("raw", "calibrated") for position in (0, 1) for b in range(0, 20, 5)
    ] if confidences and gamma else []
    requests = [
        RequestResult(record=r, prompt_key=f"gsm8k:{i}:0", sample_index=i, turn=0, warmup=i < 2,
                      output_ids=tuple(rng.randrange(96) for _ in range(r.output_tokens)))
        for i, r in enumerate(records)
    ]
    return CellResult(
        requests=requests, steps=steps, window=window,
        provenance={"target_hash": "t" * 8, "draft_hash": "d" * 8 if gamma else "", "dataset_hash": "s" * 8,
                    "backend_version": "inhouse-0", "device": "cpu"},
        sts_temperatures=temperatures, metrics=metrics, calibration_bins=bins, log="backend said hello\n",
    )


def run_info(**overrides) -> RunInfo:
    fields = dict(
        suite_name="cpu", suite_path="suites/cpu.yaml", suite_text="name: cpu\n", suite_hash="abc123",
        git_sha="0" * 40, git_branch="main", git_dirty=False, host_fingerprint="f" * 12,
        host={"cpu_model": "Test CPU", "cores": 2}, packages={"python": "3.11", "torch": "2.13.0"},
        argv=["harness", "run", "suites/cpu.yaml"], repeats=1,
    )
    fields.update(overrides)
    return RunInfo(**fields)
