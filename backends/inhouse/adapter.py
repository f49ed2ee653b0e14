"""The in-house backend: runs a suite cell on `backends.inhouse.engine` over `dspark_core`.

It is the only part of the harness that imports `dspark_core`. Per cell it loads (and keeps, for the
next cells of the run) the target, its tokenizer and the drafter; builds the verification policy
(with the drafter's STS temperatures for the cell's decoding temperature, and an SPS(B) table
profiled once per target on this device unless the suite names one); drives the engine with the
cell's closed-loop or Poisson load, MT-Bench conversations turn by turn; and returns raw records.

Seeds: request (sample i, turn t) of a cell samples from its own generator seeded by
(cell seed, i, t), the same for every drafter, so plain and speculative cells of one suite decode
the same requests with the same randomness source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backends.base import BackendError, Progress
from backends.inhouse.engine import Completed, Engine, EngineConfig, Request
from backends.inhouse.load import LoadSpec, run_load
from harness import model_refs
from harness.cells import CalibrationBin, Cell, CellResult, DrafterSpec, PolicySpec, RequestResult, TargetSpec, TaskSpec
from harness.metrics import MeasurementWindow, StepRecord, from_counters, summarise
from harness.tasks.prompts import stop_tokens

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SPS_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass
class _Target:
    model: Any  # dspark_core.target.TargetModel
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    fingerprint: str
    sps: dict[int, Any]  # context length → SPSTable profiled here


@dataclass
class BuiltEngine:
    """An engine ready to serve, with what a server needs beside it."""

    engine: Engine
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    note: str  # what building the policy reported (a profiled SPS or step-cost table), or ""


class InhouseBackend:
    name = "inhouse"

    def __init__(self, device: str | None = None, num_slots: int = 64, max_context: int = 2048, num_threads: int | None = None,
                 **unknown):
        """Options come from the suite's `backend_options.inhouse`."""
        if unknown:
            raise BackendError(f"unknown in-house backend option(s) {', '.join(sorted(unknown))}; "
                               "valid: device, num_slots, max_context, num_threads")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.num_slots = num_slots
        self.max_context = max_context
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self._targets: dict[tuple[str, str], _Target] = {}
        self._drafters: dict[tuple, tuple[Any, dict]] = {}

    # ------------------------------------------------------------------ protocol

    def check(self, cell: Cell) -> None:
        if cell.task.temperature > 0 and cell.target.dtype not in DTYPES:
            raise BackendError(f"dtype {cell.target.dtype!r} unknown; valid: {', '.join(DTYPES)}")
        missing = model_refs.first_missing((cell.target.path, cell.drafter.checkpoint))
        if missing:
            raise BackendError(missing)
        if cell.policy.name in ("threshold", "scheduler", "budget") and cell.drafter.method not in ("dspark",):
            raise BackendError(
                f"policy {cell.policy.name!r} needs confidences, which only dspark drafts have "
                f"(drafter {cell.drafter.name!r} is {cell.drafter.method}); use policy full or static"
            )

    def server_command(self, cell: Cell) -> list[str] | None:
        return None

    @torch.no_grad()
    def score_tokens(self, cell: Cell, prompt_ids, output_ids, temperature: float) -> torch.Tensor:
        """[len(output_ids), vocab] the target's next-token distribution at `temperature` before each
        output token (teacher-forced, one plain forward): what the audit tests emitted tokens against."""
        from dspark_core.distributions import logits_to_probs

        target = self._target(cell)
        ids = torch.tensor([list(prompt_ids) + list(output_ids)], device=self.device)
        logits = target.model.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : ids.shape[1] - 1]
        return logits_to_probs(logits.float(), torch.tensor(float(temperature))).cpu()

    def close(self) -> None:
        self._targets.clear()
        self._drafters.clear()

    def run_cell(self, cell: Cell, progress: Progress | None = None) -> CellResult:
        from harness.tasks import load_task, prompt_ids

        target, drafter, draft_info, sts, policy, policy_note = self._prepare(cell)
        data = load_task(cell.task.name, n_samples=cell.task.n_samples, seed=cell.seed)
        spec, samples = data.spec, data.samples
        turns = spec.turns if cell.task.multi_turn else 1
        tokenizer = target.tokenizer
        answers: list[list[str]] = [[] for _ in samples]
        first_turns = [self._request(cell, target, i, 0, prompt_ids(tokenizer, spec, s)) for i, s in enumerate(samples)]
        total = len(samples) * turns
        finished = 0

        def next_turn_from(offset: int):
            def next_turn(conv: int, turn: int, done: Completed) -> Request | None:
                nonlocal finished
                conv += offset
                finished += 1
                if progress is not None:
                    progress(finished, total)
                answers[conv].append(tokenizer.decode(done.output_ids, skip_special_tokens=True))
                if turn + 1 >= turns:
                    return None
                ids = prompt_ids(tokenizer, spec, samples[conv], answers[conv])
                return self._request(cell, target, conv, turn + 1, ids)
            return next_turn

        num_slots = cell.concurrency if cell.concurrency is not None else self.num_slots
        longest = max(len(r.prompt_ids) for r in first_turns)
        max_context = min(self.max_context, getattr(target.model.config, "max_position_embeddings", 1 << 30))
        max_context = max(max_context, longest + cell.task.max_new_tokens)
        verifier = None
        if cell.is_synthetic:  # not lossless: accepts by the suite's law (marked in label, params, provenance, metrics)
            from dspark_core.verification import synthetic_verifier
            verifier = synthetic_verifier(cell.drafter.synthetic_acceptance)
        engine = Engine(target.model, drafter, EngineConfig(num_slots=num_slots, max_context=max_context,
                                                            num_drafts=max(cell.num_drafts, 1)), policy,
                        verifier=verifier)
        # Warm-up is a phase of its own: its conversations run to completion before the measured load
        # starts, so the measured requests are the same ones in every run (the gate pairs them) and the
        # window holds no warm-up tail.
        warm = min(cell.warmup, len(first_turns) - 1)
        completed, warmup_ids = [], set()
        if warm > 0:
            phase = run_load(engine, first_turns[:warm], LoadSpec(concurrency=cell.concurrency or warm), next_turn_from(0))
            completed += phase.completed
            warmup_ids = {c.request.request_id for c in phase.completed}
        load = LoadSpec(concurrency=cell.concurrency, rate=cell.rate, seed=cell.seed)
        measured = run_load(engine, first_turns[warm:], load, next_turn_from(warm))
        completed += measured.completed
        return self._result(cell, target, draft_info, data.content_hash, completed, warmup_ids, engine.steps, sts,
                            policy_note)

    def build_engine(self, target: TargetSpec, drafter: DrafterSpec, num_drafts: int, policy: PolicySpec, *,
                     temperature: float = 0.0, num_slots: int | None = None,
                     max_context: int | None = None) -> BuiltEngine:
        """The engine `run_cell` would build for these specs, for a caller that serves it (our OpenAI server):
        same loading, drafter, policy (with the drafter's STS temperatures for `temperature`) and stop tokens."""
        num_slots = num_slots or self.num_slots
        cell = Cell(self.name, target, drafter, num_drafts, TaskSpec("served", 1, 1, temperature), policy,
                    concurrency=num_slots)
        loaded, model, _, _, verify_policy, note = self._prepare(cell)
        context = min(max_context or self.max_context, getattr(loaded.model.config, "max_position_embeddings", 1 << 30))
        engine = Engine(loaded.model, model, EngineConfig(num_slots=num_slots, max_context=context,
                                                          num_drafts=max(num_drafts, 1)), verify_policy)
        return BuiltEngine(engine, loaded.tokenizer, loaded.stop_token_ids, note)

    def _prepare(self, cell: Cell) -> tuple[_Target, Any, dict, Any, Any, str]:
        """(target, drafter, draft info, STS temperatures, policy, policy note) for a checked cell."""
        self.check(cell)
        target = self._target(cell)
        drafter, draft_info = self._drafter(cell, target)
        layer_ids = tuple(getattr(drafter, "target_layer_ids", ()) or ())
        if target.model.layer_ids != layer_ids:
            target.model.set_layer_ids(layer_ids)  # () for plain / n-gram: no hidden states computed
        sts = draft_info.get("sts", {}).get(f"{cell.task.temperature:g}")
        policy, note = self._policy(cell, target, sts, drafter)
        return target, drafter, draft_info, sts, policy, note

    # ------------------------------------------------------------------ resources

    def _target(self, cell: Cell) -> _Target:
        from transformers import AutoTokenizer

        from dspark_core.target import TargetModel

        ref = model_refs.resolve(cell.target.path)
        key = (ref.location, cell.target.dtype)
        if key not in self._targets:
            dtype = DTYPES[cell.target.dtype]
            model = TargetModel.from_pretrained(ref.location, dtype=dtype, device=self.device)
            tokenizer = AutoTokenizer.from_pretrained(ref.location)
            self._targets[key] = _Target(model, tokenizer, stop_tokens(tokenizer), model_refs.fingerprint(ref), {})
        return self._targets[key]

    def _drafter(self, cell: Cell, target: _Target) -> tuple[Any, dict]:
        from dspark_core.drafters import as_drafter, build_drafter

        d = cell.drafter
        key = (d.method, d.checkpoint, d.head, id(target))
        if key not in self._drafters:
            info: dict[str, Any] = {"draft_hash": ""}
            if d.method in ("none", "ngram"):
                drafter = build_drafter(d.method)
            elif d.method == "draft_model":
                drafter, info = self._draft_model(cell, target)
            else:
                ref = model_refs.resolve(d.checkpoint or "")
                model = _load_weighted_draft(ref, target)
                if model.config.method != d.method:
                    raise BackendError(f"checkpoint {d.checkpoint} holds a {model.config.method!r} draft, not {d.method!r}")
                if d.head is not None and getattr(model.config, "head", None) != d.head:
                    raise BackendError(f"checkpoint {d.checkpoint} has the {model.config.head!r} head, the cell asks for {d.head!r}")
                drafter = as_drafter(model)
                sts = model.config.extra.get("sts_temperatures") or {}
                info = {"draft_hash": model_refs.fingerprint(ref), "sts": {t: tuple(v) for t, v in sts.items()}}
            self._drafters[key] = (drafter, info)
        return self._drafters[key]

    def _draft_model(self, cell: Cell, target: _Target) -> tuple[Any, dict]:
        """A Hugging Face causal LM as the draft, on the target's device and dtype. The target's own
        checkpoint (`embedded` for the embedded default) shares the target's weights rather than loading
        them twice; any other must have the target's vocabulary and tokenizer."""
        from dspark_core.drafters import DraftModelDrafter, VocabularyMismatch, load_draft_model

        ref = model_refs.resolve(cell.drafter.checkpoint or "")
        try:
            if ref.location == model_refs.resolve(cell.target.path).location:
                drafter = DraftModelDrafter(target.model, target=target.model)
            else:
                drafter = load_draft_model(ref.location, target=target.model, target_tokenizer=target.tokenizer)
        except VocabularyMismatch as exc:
            raise BackendError(f"drafter {cell.drafter.name!r} ({cell.drafter.checkpoint}): {exc}") from None
        except (OSError, ValueError) as exc:
            raise BackendError(f"drafter {cell.drafter.name!r}: cannot load {cell.drafter.checkpoint} "
                               f"({ref.location}) as a Hugging Face causal LM: {exc}") from None
        return drafter, {"draft_hash": model_refs.fingerprint(ref)}

    def _policy(self, cell: Cell, target: _Target, sts, drafter) -> tuple[Any, str]:
        from dspark_core import scheduler

        p = cell.policy
        temps = torch.tensor(sts[: cell.num_drafts], dtype=torch.float64) if sts else None
        if cell.is_plain or p.name == "full":
            return None, ""
        if p.name == "static":
            return scheduler.StaticLength(p.verify_length), ""
        if p.name == "threshold":
            return scheduler.ConfidenceThreshold(p.threshold, temperatures=temps), ""
        if p.name == "adaptive":
            costs, note = self._step_costs(cell, target, drafter)
            return scheduler.CostAwareScheduler(costs, temperatures=temps), note
        sps, note = self._sps(cell, target)
        if p.name == "scheduler":
            return scheduler.PrefixScheduler(sps, temperatures=temps), note
        if p.name == "budget":
            return scheduler.AsyncBudgetScheduler(sps, temperatures=temps), note
        raise BackendError(f"policy {p.name!r} is not supported by the in-house backend")

    def _step_costs(self, cell: Cell, target: _Target, drafter) -> tuple[Any, str]:
        """The adaptive policy's step-cost table: from the suite's file, or profiled on this device once per
        (drafter, γ, batch sizes up to the cell's concurrency rounded up to a power of two)."""
        from backends.inhouse.profile import profile_step_costs
        from dspark_core import costs as sps_tables

        context = 256
        if cell.policy.sps_table:
            fp = sps_tables.fingerprint_for(target.model, context)
            return (sps_tables.load_step_cost_table(cell.policy.sps_table, fp),
                    f"step costs {cell.policy.sps_table}")
        top = 1 << max(0, ((cell.concurrency or self.num_slots) - 1).bit_length())
        rows = tuple(1 << i for i in range(top.bit_length()))
        key = ("step_costs", cell.drafter.method, cell.drafter.checkpoint, cell.drafter.head, cell.num_drafts, rows)
        if key not in target.sps:
            target.sps[key] = profile_step_costs(target.model, drafter, rows, context, num_drafts=cell.num_drafts,
                                                 repeats=3).monotone()
        table = target.sps[key]
        return table, "step costs profiled " + " ".join(
            f"{r}:{1e3 * v[0]:.1f}/{1e3 * (v[-1] + d[-1]):.1f}ms" for r, v, d in zip(table.rows, table.verify_s, table.draft_s))

    def _sps(self, cell: Cell, target: _Target):
        from backends.inhouse.profile import profile_sps
        from dspark_core import costs as sps_tables

        context = 256
        if cell.policy.sps_table:
            fp = sps_tables.fingerprint_for(target.model, context)
            return sps_tables.load_sps_table(cell.policy.sps_table, fp), f"sps table {cell.policy.sps_table}"
        if context not in target.sps:
            target.sps[context] = profile_sps(target.model, SPS_BATCH_SIZES, context, repeats=5)
        table = target.sps[context]
        return table, "sps profiled " + " ".join(f"{b}:{s:.0f}" for b, s in zip(table.batch_sizes, table.steps_per_second))

    def _request(self, cell: Cell, target: _Target, sample: int, turn: int, prompt: list[int]) -> Request:
        return Request(
            request_id=f"{sample}:{turn}", prompt_ids=prompt, max_new_tokens=cell.task.max_new_tokens,
            temperature=cell.task.temperature, seed=(cell.seed * 1_000_003 + sample * 1_009 + turn) % (2**63),
            stop_token_ids=target.stop_token_ids,
        )

    # ------------------------------------------------------------------ records

    def _result(self, cell, target, draft_info, dataset_hash, completed, warmup_ids, engine_steps, sts,
                policy_note) -> CellResult:
        requests = []
        for done in completed:
            sample, turn = (int(x) for x in done.request.request_id.split(":"))
            record = from_counters(
                done.counters, request_id=done.request.request_id, prompt_tokens=len(done.request.prompt_ids),
                output_tokens=len(done.output_ids), arrival_s=done.arrival_s, first_token_s=done.first_token_s,
                finish_s=done.finish_s, emissions=done.emissions, finish_reason=done.finish_reason,
            )
            requests.append(RequestResult(
                record, f"{cell.task.name}:{sample}:{turn}", sample, turn,
                done.request.request_id in warmup_ids, tuple(done.output_ids),
                tuple(done.request.prompt_ids),
            ))
        steps = [
            StepRecord(i, s.end_s, s.batch_size, s.verified_tokens - s.batch_size, s.accepted_drafts, s.end_s - s.start_s)
            for i, s in enumerate(engine_steps)
        ]
        window = MeasurementWindow.after_warmup_phase(
            [r.record for r in requests if not r.warmup], [r.record for r in requests if r.warmup])
        records = [r.record for r in requests]
        temperatures = sts[: cell.num_drafts] if sts and not cell.is_plain else None
        metrics = summarise(records, steps, window, sla=cell.sla, temperatures=temperatures)
        import transformers

        provenance = {
            "target_hash": target.fingerprint,
            "draft_hash": draft_info.get("draft_hash", ""),
            "dataset_hash": dataset_hash,
            "backend_version": f"inhouse/torch-{torch.__version__}/transformers-{transformers.__version__}",
            "device": str(self.device),
            "threads": str(torch.get_num_threads()),
        }
        if model_refs.is_random(cell.target.path):  # random weights (model_refs): engine speed only, never quality
            provenance["random_weights"] = cell.target.path
        if cell.is_synthetic:  # every row of a synthetic cell says so: provenance, and a metric of its own
            provenance["synthetic_acceptance"] = list(cell.drafter.synthetic_acceptance)
            metrics = synthetic_marked(metrics)
        bins = calibration_bins(records, window, temperatures)
        return CellResult(requests, steps, window, provenance,
                          tuple(temperatures) if temperatures else None, metrics, bins, policy_note)


def synthetic_marked(metrics):
    """The metrics plus `synthetic_acceptance` = 1: a flag row in the store (`metrics`), so a query over
    acceptance or throughput can exclude (or select) cells whose acceptance was synthetic, not measured."""
    from harness.metrics import Metric, MetricSet

    return MetricSet({**metrics, "synthetic_acceptance": Metric(1.0, "flag", 1)})


def calibration_bins(records, window: MeasurementWindow, temperatures) -> list[CalibrationBin]:
    """The window's reliability bins per draft position (`harness.metrics.confidence.reliability_bins`)."""
    from harness.metrics import requests_in, succeeded
    from harness.metrics.confidence import reliability_bins

    return [CalibrationBin(*row) for row in reliability_bins(succeeded(requests_in(records, window)), temperatures)]


def _load_weighted_draft(ref, target: _Target):
    """A draft in our format (draft_config.json), else a released DeepSpec / vLLM-layout checkpoint
    (config.json: `Qwen3DSparkModel`, DSpark or DFlash); a hub id is fetched into (or read from) the HF cache."""
    from dspark_core.checkpoint import load_deepspec_draft, load_draft

    location = Path(ref.location)
    if not ref.is_local:
        from huggingface_hub import snapshot_download

        location = Path(snapshot_download(ref.location))
    load = load_draft if (location / "draft_config.json").is_file() or not (location / "config.json").is_file() \
        else load_deepspec_draft
    return load(location, device=target.model.device, dtype=target.model.dtype, target=target.model)
