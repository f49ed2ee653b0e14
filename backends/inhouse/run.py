"""Running one suite cell on a built in-house engine, and what it reports: raw records, nothing derived.

The cell's task conversations (MT-Bench turn by turn, each next turn built from the model's own answer)
drive the engine under the cell's closed-loop or Poisson load (`load.py`). Warm-up is a phase of its own:
its conversations run to completion before the measured load starts, so the measured requests are the
same ones in every run (the gate pairs them) and the window holds no warm-up tail. The result is the
contracts' `CellResult` of records; the executor derives the metrics (`harness.metrics.derive`).

Seeds: request (sample i, turn t) of a cell samples from its own generator seeded by `Cell.request_seed`
(cell seed, round, i, t), the same for every drafter, so plain and speculative cells of one round decode the
same requests with the same randomness source, and each round is a new draw.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from backends.inhouse.build import Built, LoadedTarget, build_engine
from backends.inhouse.engine import Completed, Request
from backends.inhouse.load import LoadSpec, run_load
from contracts.backend import Progress
from contracts.cells import Cell, CellResult, RequestResult
from contracts.records import MeasurementWindow, RequestRecord
from dspark_core import decode_attention, decoder_forward, packed_linear
from inputs import model_refs


def run_cell(cell: Cell, built: Built, *, num_slots: int, max_context: int, device: torch.device,
             progress: Progress | None = None) -> CellResult:
    """Measure `cell` on an engine over `built` (`num_slots` when the load is open-loop, else its concurrency)."""
    from inputs.tasks import load_task, prompt_ids

    target = built.target
    data = load_task(cell.task.name, n_samples=cell.task.n_samples, seed=cell.seed)
    spec, samples = data.spec, data.samples
    turns = spec.turns if cell.task.multi_turn else 1
    tokenizer = target.tokenizer
    answers: list[list[str]] = [[] for _ in samples]

    def request(sample: int, turn: int) -> Request:
        return Request(
            request_id=f"{sample}:{turn}", prompt_ids=prompt_ids(tokenizer, spec, samples[sample], answers[sample]),
            max_new_tokens=cell.task.max_new_tokens, temperature=cell.task.temperature,
            seed=cell.request_seed(sample, turn), stop_token_ids=target.stop_token_ids,
        )

    first_turns = [request(i, 0) for i in range(len(samples))]
    total, finished = len(samples) * turns, 0

    def next_turn_from(offset: int):
        def next_turn(conv: int, turn: int, done: Completed) -> Request | None:
            nonlocal finished
            conv += offset
            finished += 1
            if progress is not None:
                progress(finished, total)
            answers[conv].append(tokenizer.decode(done.output_ids, skip_special_tokens=True))
            return request(conv, turn + 1) if turn + 1 < turns else None
        return next_turn

    verifier = None
    if cell.is_synthetic:  # not lossless: accepts by the suite's law (marked in label, params, provenance, metrics)
        from dspark_core.verification import synthetic_verifier
        verifier = synthetic_verifier(cell.drafter.synthetic_acceptance or ())
    longest = max(len(r.prompt_ids) for r in first_turns) + cell.task.max_new_tokens
    engine = build_engine(built, cell.num_drafts, cell.concurrency if cell.concurrency is not None else num_slots,
                          max_context, longest=longest, verifier=verifier)
    warm = min(cell.warmup, len(first_turns) - 1)
    completed: list[Completed] = []
    warmup_ids: set[str] = set()
    if warm > 0:
        phase = run_load(engine, first_turns[:warm], LoadSpec(concurrency=cell.concurrency or warm), next_turn_from(0))
        completed += phase.completed
        warmup_ids = {c.request.request_id for c in phase.completed}
    load = LoadSpec(concurrency=cell.concurrency, rate=cell.rate, seed=cell.seed)
    completed += run_load(engine, first_turns[warm:], load, next_turn_from(warm)).completed

    requests = [request_result(cell, done, done.request.request_id in warmup_ids) for done in completed]
    window = MeasurementWindow.after_warmup_phase(
        [r.record for r in requests if not r.warmup], [r.record for r in requests if r.warmup])
    return CellResult(requests, list(engine.steps), window, provenance(cell, built, data.content_hash, device),
                      built.temperatures, log=built.note, sts_offsets=built.offsets)


def request_result(cell: Cell, done: Completed, warmup: bool) -> RequestResult:
    """One finished request as the store pairs it across runs ("<task>:<sample>:<turn>")."""
    sample, turn = (int(x) for x in done.request.request_id.split(":"))
    return RequestResult(record_of(done), f"{cell.task.name}:{sample}:{turn}", sample, turn, warmup,
                         tuple(done.output_ids), tuple(done.request.prompt_ids))


def record_of(done: Completed) -> RequestRecord:
    """The contracts' record of a finished engine request: its counters (`dspark_core.generate.RequestCounters`)
    with the engine's timestamps; emission events `(time, tokens emitted together)` become one time per token."""
    counters = done.counters
    record = RequestRecord(
        request_id=done.request.request_id,
        prompt_tokens=len(done.request.prompt_ids),
        output_tokens=len(done.output_ids),
        arrival_s=done.arrival_s,
        first_token_s=done.first_token_s,
        finish_s=done.finish_s,
        token_times_s=tuple(t for t, count in done.emissions for _ in range(count)),
        num_drafts=counters.num_drafts,
        num_verified=tuple(counters.num_verified),
        num_accepted=tuple(counters.num_accepted),
        confidence_logits=tuple(tuple(c) for c in counters.confidence_logits),
        finish_reason=done.finish_reason,
    )
    if tuple(counters.accepted_histogram) != record.accepted_histogram:
        raise ValueError(f"request {record.request_id!r}: counters' histogram disagrees with their per-step counts")
    return record


def provenance(cell: Cell, built: Built, dataset_hash: str, device: torch.device) -> dict[str, Any]:
    """What the cell ran on, for the comparability key and the report."""
    import transformers

    out: dict[str, Any] = {
        "target_hash": built.target.fingerprint,
        "draft_hash": built.drafter.draft_hash,
        "dataset_hash": dataset_hash,
        "backend_version": f"inhouse/torch-{torch.__version__}/transformers-{transformers.__version__}",
        "device": str(device),
        "threads": str(torch.get_num_threads()),
    }
    model = built.target.model
    lean = getattr(model, "lean", False)
    attention = decode_attention.path(model.dtype, model.device, model.decode_products) if lean else None
    if attention is not None:  # a bf16 target on the CPU: the kernel, its twin or SDPA ran its decode steps
        out["decode_attention"] = attention
        fits = model.fused_pointwise and decoder_forward.pointwise_fits(model.model, model.dtype, model.device)
        out["decoder_pointwise"] = "c++ kernels" if fits else "torch ops"
        out["linear"] = packed_linear.path(model.dtype, model.device, model.bf16_linear) if model.pack_weights else "torch"
    if model_refs.is_random(cell.target.path):  # random weights (inputs.model_refs): engine speed only, never quality
        out["random_weights"] = cell.target.path
    if cell.is_synthetic:  # every row of a synthetic cell says so (and `derive` adds its flag metric)
        out["synthetic_acceptance"] = list(cell.drafter.synthetic_acceptance or ())
    return out


@torch.no_grad()
def score_tokens(target: LoadedTarget, prompt_ids: Sequence[int], output_ids: Sequence[int],
                 temperature: float) -> torch.Tensor:
    """[len(output_ids), vocab] the target's next-token distribution at `temperature` before each output token
    (teacher-forced, one plain forward): what the audit tests emitted tokens against."""
    from dspark_core.distributions import logits_to_probs

    model = target.model
    ids = torch.tensor([list(prompt_ids) + list(output_ids)], device=model.device)
    logits = model.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : ids.shape[1] - 1]
    return logits_to_probs(logits.float(), torch.tensor(float(temperature))).cpu()
