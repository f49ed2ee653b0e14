"""What one suite cell is and what running it yields: the contract between suite, runner, store and gate.

A `Cell` is one fully specified measurement (backend × target × drafter × γ × task × load × policy ×
seed); `harness.suite` expands a suite into cells, a backend runs one and returns a `CellResult` of
raw records, the executor derives the metrics (`harness.metrics.derive`), and the store keeps both. In the
leaf `contracts` package, because suite, runner, store and every backend share it and import nothing of
each other through it. Cells are identified by a hash
of their canonical parameters, so the same measurement in two runs (or two suites) has the same id:
that is what the gate pairs on, together with the comparability key of what it ran on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from contracts.metric import MetricSet
from contracts.records import MeasurementWindow, RequestRecord, ServerTTFT, SpecCounts, StepRecord


@dataclass(frozen=True)
class TargetSpec:
    name: str  # the suite's name for it (a key of `targets:`)
    path: str  # local directory or hub id; "embedded" resolves to the committed embedded default
    dtype: str = "float32"


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # the suite's name for it (a key of `drafters:`); "none" is plain decoding
    method: str  # none | dspark | dflash | eagle3 | ngram | draft_model
    checkpoint: str | None = None  # draft checkpoint directory (methods with weights)
    head: str | None = None  # dspark head override (markov | gated | rnn); None: the checkpoint's
    # Synthetic acceptance (engine speed apart from drafter quality; NOT lossless): per-position conditional
    # acceptance rates the verifier accepts by instead of the target (dspark_core.verification.synthetic_verifier)
    synthetic_acceptance: tuple[float, ...] | None = None


@dataclass(frozen=True)
class TaskSpec:
    name: str  # a task of inputs.tasks (gsm8k | humaneval | mt_bench | a user task)
    n_samples: int
    max_new_tokens: int
    temperature: float = 0.0
    multi_turn: bool = True  # conversations with several turns (MT-Bench) run all of them


@dataclass(frozen=True)
class PolicySpec:
    """How many of each step's γ drafts to verify (dspark_core.scheduler)."""

    name: str  # full | static | threshold | scheduler | budget | adaptive
    verify_length: int | None = None  # static: γ' ≤ γ
    threshold: float | None = None  # threshold: σ(c_k) cut-off
    sps_table: str | None = None  # scheduler/budget: SPS(B) table JSON; adaptive: a store with step costs;
    #                               None: profiled on the device before the first cell that needs it


@dataclass(frozen=True)
class SLA:
    """Per-request service bounds, the one SLA type: the suite's `sla:` section (harness.suite.schema checks
    its values), a cell's `sla` and what goodput and attainment judge by. None leaves a bound out.

    ttft_s                 time to first token at most this
    tpot_s                 time per output token (after the first) at most this
    min_user_tokens_per_s  the request's decode speed at least this

    A request meets the SLA iff it succeeded and meets every bound that applies to it: a one-token request
    has no TPOT or decode speed, so those bounds are vacuous for it (its TTFT bound still applies)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    min_user_tokens_per_s: float | None = None


@dataclass(frozen=True)
class Cell:
    backend: str  # inhouse | vllm | sglang | openai (any OpenAI-compatible endpoint)
    target: TargetSpec
    drafter: DrafterSpec
    num_drafts: int  # γ; 0 for plain decoding
    task: TaskSpec
    policy: PolicySpec
    concurrency: int | None = None  # closed loop (exactly one of concurrency / rate)
    rate: float | None = None  # open loop, requests/s
    warmup: int = 0  # first conversations run but not measured
    seed: int = 0
    sla: SLA | None = None  # the one SLA type (suite section, cell, goodput: harness.metrics.rates.meets)
    backend_options: tuple[tuple[str, Any], ...] = ()  # sorted (key, value) pairs, e.g. server arguments
    # Which draw of the cell's sampling randomness its requests take: the runner's round (`in_round`). Not a
    # parameter: the cell's id, axes and row are the same in every round.
    sampling_round: int = 0

    def params(self) -> dict[str, Any]:
        """Canonical, JSON-able parameters: everything that defines the measurement."""
        out = asdict(self)
        del out["sampling_round"]
        out["backend_options"] = dict(self.backend_options)
        if self.drafter.synthetic_acceptance is None:  # absent, not null: real cells keep their ids
            del out["drafter"]["synthetic_acceptance"]
        else:
            out["drafter"]["synthetic_acceptance"] = list(self.drafter.synthetic_acceptance)
        return out

    def in_round(self, round_: int) -> Cell:
        """This cell as round `round_` measures it: the same requests, sampled from that round's seeds."""
        return replace(self, sampling_round=round_)

    def request_seed(self, sample: int, turn: int) -> int:
        """The sampling seed of request (sample, turn), which every backend sends with the request.

        Shared by every drafter and by plain decoding, so the cells of one round decode the same requests from
        the same randomness source and their ratio is paired. It differs between rounds: at T > 0 a round is a
        new draw of the outputs, so repeating a sampled cell adds data, not a copy of round 0 (a deterministic
        engine would otherwise replay it step for step). Greedy cells ignore it, and their rounds replay one
        another (`harness.gate.data.replayed_rounds` counts such copies once). Round 0 keeps the seeds that
        runs before rounds drew their own had, so its requests still pair with theirs."""
        round_step = self.sampling_round * 0x9E3779B97F4A7C15  # the golden-ratio step: rounds far apart
        return (self.seed * 1_000_003 + sample * 1_009 + turn + round_step) % (2**63)

    @property
    def is_synthetic(self) -> bool:
        """Accepts by a synthetic law, not by the target: never lossless, marked wherever it shows."""
        return self.drafter.synthetic_acceptance is not None

    @property
    def cell_id(self) -> str:
        """12 hex digits of sha256 over the canonical parameters: stable across runs, suites and machines."""
        text = json.dumps(self.params(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def is_plain(self) -> bool:
        return self.drafter.method == "none"

    def axes(self) -> dict[str, Any]:
        """The flat columns a table shows and the store indexes."""
        return {
            "backend": self.backend,
            "target": self.target.name,
            "drafter": self.drafter.name,
            "method": self.drafter.method,
            "num_drafts": self.num_drafts,
            "task": self.task.name,
            "temperature": self.task.temperature,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "policy": self.policy.name,
            "seed": self.seed,
        }

    def label(self) -> str:
        load = f"c{self.concurrency}" if self.concurrency is not None else f"r{self.rate:g}"
        gamma = "" if self.is_plain else f" γ{self.num_drafts} {self.policy.name}"
        if self.is_synthetic:
            gamma += " SYNTHETIC α=" + ",".join(f"{r:g}" for r in self.drafter.synthetic_acceptance)
        target = self.target.name + (" RANDOM-WEIGHTS" if self.target.path.startswith("random:") else "")
        return f"{self.backend}/{target}/{self.drafter.name}{gamma}/{self.task.name} T{self.task.temperature:g}/{load}"


@dataclass(frozen=True)
class RequestResult:
    """One request (one turn) with what pairs it across runs and what the audit compares."""

    record: RequestRecord
    prompt_key: str  # stable across runs: "<task>:<sample index>:<turn>"
    sample_index: int
    turn: int
    warmup: bool
    output_ids: tuple[int, ...] = ()
    prompt_ids: tuple[int, ...] = ()  # what the backend tokenised (the audit scores outputs after it); not stored


@dataclass(frozen=True)
class CalibrationBin:
    """One reliability-diagram bin of one draft position k ≥ 1 (stores before the one-ECE change also hold
    position 0, every position pooled: a different statistic, which nothing reads any more)."""

    kind: str  # raw | calibrated
    position: int
    bin: int
    lower: float
    upper: float
    count: int
    confidence_sum: float  # Σ predicted survival a_j in the bin
    outcome_sum: float  # Σ realised survival y_j in the bin


@dataclass
class CellResult:
    """One cell run: the raw records a backend returns, and what the harness derives from them.

    A backend fills the records only; `metrics` and `calibration_bins` are derived by the executor
    (`harness.metrics.derive`) before the store keeps them, the same way for every backend."""

    requests: list[RequestResult]
    steps: list[StepRecord]  # engine steps ([] where the engine does not report them: a remote server)
    window: MeasurementWindow
    provenance: dict[str, str] = field(default_factory=dict)  # target_hash, draft_hash, dataset_hash, backend_version, device
    sts_temperatures: tuple[float, ...] | None = None  # [γ] calibrated-ECE temperatures of the drafter
    metrics: MetricSet = field(default_factory=MetricSet)  # derived (harness.metrics.derive); backends leave it empty
    calibration_bins: list[CalibrationBin] = field(default_factory=list)  # derived, as `metrics`
    log: str = ""  # what the backend printed (server logs), kept for failed cells
    # A server that reports no per-request steps: its spec-decode counters over the measured phase, which then
    # define acceptance; and its own TTFT totals (both server-wide, a difference of two scrapes; None: none)
    spec_counts: SpecCounts | None = None
    server_ttft: ServerTTFT | None = None
    sts_offsets: tuple[float, ...] | None = None  # [γ] level offsets fitted with sts_temperatures (fit_sts_level), or None
