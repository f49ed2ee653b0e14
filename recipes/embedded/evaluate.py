"""Measuring the embedded default: acceptance, calibration and speed of each draft on the three tasks.

This is what the model card reports and what the quickstart's main job prints until the harness
runner lands: per task and drafter, acceptance length τ (1 + accepted ÷ drafting steps, from harness.metrics),
first-position acceptance, ECE raw and STS-calibrated, and tokens/s against plain decoding measured
in the same run. MT-Bench is run as two turns: the second user turn follows the model's own first
answer, generated with the same drafter (lossless, so it is the target's answer).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from dspark_core.calibration import expected_calibration_error
from dspark_core.drafters.base import Drafter
from dspark_core.generate import GenerationConfig, GenerationResult, generate
from dspark_core.target import TargetModel
from contracts.records import RequestRecord
from harness.metrics import acceptance
from inputs.model_refs import embedded_root
from inputs.tasks.prompts import stop_tokens


@dataclass(frozen=True)
class Measurement:
    task: str
    drafter: str
    gamma: int
    temperature: float
    num_prompts: int
    num_steps: int
    output_tokens: int
    acceptance_length: float  # τ = 1 + accepted ÷ drafting steps (harness.metrics.acceptance), bonus included
    first_position_acceptance: float  # P(draft 1 accepted)
    ece_raw: float | None
    ece_calibrated: float | None
    wall_s: float
    tokens_per_s: float

    def row(self) -> dict:
        return asdict(self)


def run_task(
    target: TargetModel,
    drafter: Drafter,
    tokenizer,
    task: str,
    *,
    n_samples: int,
    gamma: int,
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
) -> tuple[list[GenerationResult], float]:
    """Generate every turn of every sample in one batch per turn; returns results and wall seconds."""
    from inputs.tasks import load_task, prompt_ids

    data = load_task(task, n_samples=n_samples, seed=seed)
    spec, samples = data.spec, data.samples
    config = GenerationConfig(max_new_tokens=max_new_tokens, num_drafts=gamma, temperature=temperature,
                              stop_token_ids=stop_tokens(tokenizer))
    answers: list[list[str]] = [[] for _ in samples]
    results: list[GenerationResult] = []
    wall = 0.0
    for turn in range(spec.turns):
        prompts = [prompt_ids(tokenizer, spec, s, answers[i]) for i, s in enumerate(samples)]
        start = time.perf_counter()
        out = generate(target, drafter, prompts, config, seed=seed * 1000 + turn * 100_000)
        wall += time.perf_counter() - start
        for i, r in enumerate(out):
            answers[i].append(tokenizer.decode(r.output_ids, skip_special_tokens=True))
        results.extend(out)
    return results, wall


def as_record(index: int, result: GenerationResult, gamma: int) -> RequestRecord:
    """A generation's raw counters as the harness's request record, so τ and α come from harness.metrics."""
    c = result.counters
    return RequestRecord(request_id=str(index), prompt_tokens=0, output_tokens=len(result.output_ids), arrival_s=0.0,
                         first_token_s=0.0, finish_s=0.0, num_drafts=c.num_drafts, num_verified=tuple(c.num_verified),
                         num_accepted=tuple(c.num_accepted))


def summarise(
    task: str, drafter: str, gamma: int, temperature: float, results: Sequence[GenerationResult], wall_s: float,
    temperatures: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
) -> Measurement:
    records = [as_record(i, r, gamma) for i, r in enumerate(results)]
    tau = acceptance.acceptance_length(records).value  # the harness's one definition (harness.metrics.acceptance)
    positions = acceptance.position_acceptance_unconditional(records)
    alpha1 = positions[0].value if positions else None
    steps = sum(len(r.num_verified) for r in records)
    output_tokens = sum(len(r.output_ids) for r in results)
    ece_raw = ece_cal = None
    conf = confidence_table(results, gamma)
    if conf is not None:
        ece_raw = expected_calibration_error(*conf).ece
        if temperatures is not None:
            ece_cal = expected_calibration_error(*conf, temperatures=temperatures, offsets=offsets).ece
    return Measurement(
        task=task, drafter=drafter, gamma=gamma, temperature=temperature, num_prompts=len(results),
        num_steps=steps, output_tokens=output_tokens,
        acceptance_length=float("nan") if tau is None else tau,
        first_position_acceptance=float("nan") if alpha1 is None else alpha1,
        ece_raw=ece_raw, ece_calibrated=ece_cal, wall_s=wall_s,
        tokens_per_s=output_tokens / wall_s if wall_s > 0 else float("nan"),
    )


def confidence_table(results: Sequence[GenerationResult], gamma: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(conf_logits [cycles, γ], num_verified, num_accepted) over every step that carried confidences."""
    rows, verified, accepted = [], [], []
    for r in results:
        c = r.counters
        if not c.confidence_logits:
            continue
        for logits, v, a in zip(c.confidence_logits, c.num_verified, c.num_accepted):
            rows.append(list(logits) + [0.0] * (gamma - len(logits)))
            verified.append(v)
            accepted.append(a)
    if not rows:
        return None
    return torch.tensor(rows), torch.tensor(verified), torch.tensor(accepted)


@dataclass(frozen=True)
class EvalPreset:
    tasks: tuple[str, ...] = ("gsm8k", "humaneval", "mt_bench")
    drafters: tuple[str, ...] = ("none", "ngram", "dspark", "dspark-rnn", "dflash", "eagle3")
    n_samples: int = 50
    gamma: int = 7
    temperatures: tuple[float, ...] = (0.0, 1.0)
    max_new_tokens: int = 128
    seed: int = 0


EVAL_PRESETS = {
    "default": EvalPreset(),
    "reduced": EvalPreset(n_samples=4, max_new_tokens=24),
}


@dataclass
class Embedded:
    target: TargetModel
    tokenizer: object
    drafters: dict[str, Drafter]
    sts_temperatures: dict[str, dict[str, torch.Tensor]]  # draft → decoding temperature f"{T:g}" → [γ]
    sts_offsets: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # the level offsets, same keys


def load_embedded(root: str | Path, drafter_names: Sequence[str] | None = None, *, target_dir: str | Path | None = None,
                  dtype: torch.dtype = torch.float32) -> Embedded:
    """Target, tokenizer and drafts of an embedded-default directory (`target/`, `drafts/<name>/`); a real
    target's drafts sit without their target, which lives elsewhere (`target_dir`)."""
    from transformers import AutoTokenizer

    from dspark_core.checkpoint import load_draft
    from dspark_core.drafters import as_drafter, build_drafter

    root = Path(root)
    target_dir = Path(target_dir) if target_dir is not None else root / "target"
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target = TargetModel.from_pretrained(target_dir, dtype=dtype)
    available = sorted(p.name for p in (root / "drafts").iterdir() if (p / "draft_config.json").exists())
    names = list(drafter_names) if drafter_names is not None else ["none", "ngram", *available]
    drafters: dict[str, Drafter] = {}
    temps: dict[str, dict[str, torch.Tensor]] = {}
    offsets: dict[str, dict[str, torch.Tensor]] = {}
    for name in names:
        if name in ("none", "ngram"):
            drafters[name] = build_drafter(name)
            continue
        if name not in available:
            raise ValueError(f"no draft {name!r} in {root / 'drafts'}; available: {', '.join(available)}")
        model = load_draft(root / "drafts" / name, device=target.device, dtype=target.dtype, target=target)
        drafters[name] = as_drafter(model)
        sts = model.config.extra.get("sts_temperatures") or {}
        temps[name] = {t: torch.tensor(v) for t, v in sts.items()}
        offsets[name] = {t: torch.tensor(v) for t, v in (model.config.extra.get("sts_offsets") or {}).items()}
    return Embedded(target, tokenizer, drafters, temps, offsets)


def evaluate_embedded(root: str | Path, preset: EvalPreset, log=print, *, target_dir: str | Path | None = None,
                      dtype: torch.dtype = torch.float32) -> list[Measurement]:
    """Every task × drafter × temperature of the preset, on the same prompts; plain decoding included."""
    emb = load_embedded(root, preset.drafters, target_dir=target_dir, dtype=dtype)
    out = []
    for task in preset.tasks:
        for temperature in preset.temperatures:
            for name, drafter in emb.drafters.items():
                # the layers this drafter reads (none for plain / n-gram), as the in-house adapter sets them
                emb.target.set_layer_ids(tuple(getattr(drafter, "target_layer_ids", ()) or ()))
                results, wall = run_task(
                    emb.target, drafter, emb.tokenizer, task, n_samples=preset.n_samples, gamma=preset.gamma,
                    temperature=temperature, max_new_tokens=preset.max_new_tokens, seed=preset.seed,
                )
                sts = emb.sts_temperatures.get(name, {}).get(f"{temperature:g}")
                levels = emb.sts_offsets.get(name, {}).get(f"{temperature:g}") if sts is not None else None
                m = summarise(task, name, preset.gamma, temperature, results, wall, sts, levels)
                log(f"{task:10s} T={temperature:g} {name:11s} τ={m.acceptance_length:.2f} "
                    f"tok/s={m.tokens_per_s:.0f} ECE={m.ece_raw} → {m.ece_calibrated}")
                out.append(m)
    return out


def format_table(rows: Sequence[Measurement]) -> str:
    plain = {(m.task, m.temperature): m.tokens_per_s for m in rows if m.drafter == "none"}
    lines = [f"{'task':10s} {'T':>4s} {'draft':11s} {'τ':>5s} {'α1':>5s} {'tok/s':>7s} {'speed-up':>8s} {'ECE raw→cal':>14s}"]
    for m in rows:
        base = plain.get((m.task, m.temperature))
        ece = f"{m.ece_raw:.3f}→{m.ece_calibrated:.3f}" if m.ece_raw is not None and m.ece_calibrated is not None else ""
        lines.append(
            f"{m.task:10s} {m.temperature:4g} {m.drafter:11s} {m.acceptance_length:5.2f} {m.first_position_acceptance:5.2f} "
            f"{m.tokens_per_s:7.0f} {m.tokens_per_s / base if base else float('nan'):8.2f} {ece:>14s}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m recipes.embedded.evaluate",
        description="Speculative decoding on the embedded default: acceptance, calibration and speed-up per task.",
    )
    parser.add_argument("--root", type=Path, default=None, help="embedded-default directory (default: models/embedded)")
    parser.add_argument("--tasks", nargs="+", default=list(EvalPreset.tasks))
    parser.add_argument("--drafters", nargs="+", default=list(EvalPreset.drafters))
    parser.add_argument("--n-samples", type=int, default=10)
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    root = args.root or embedded_root()
    if not (root / "target" / "config.json").exists():
        parser.error(f"no embedded default at {root} (expected target/config.json); "
                     "build one with `python -m recipes.embedded.build DIR` or pass --root")
    preset = EvalPreset(tasks=tuple(args.tasks), drafters=tuple(args.drafters), n_samples=args.n_samples,
                        gamma=args.gamma, temperatures=tuple(args.temperatures), max_new_tokens=args.max_new_tokens)
    rows = evaluate_embedded(root, preset, log=lambda line: print(line, flush=True))
    print()
    print(format_table(rows))
    if args.json:
        import json

        args.json.write_text(json.dumps([m.row() for m in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
