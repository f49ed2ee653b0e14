"""MODEL_CARD.md for the embedded default, written from what the build measured (never typed in).

The relations the paper reports are checked and printed as they came out, holds or not: the card is a
measurement, so a relation that fails at toy scale is shown failing, with the numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

TASK_ORDER = ("gsm8k", "humaneval", "mt_bench")
DRAFT_ORDER = ("dspark", "dspark-rnn", "dflash", "eagle3", "ngram", "none")


def _fmt(x, digits: int = 2) -> str:
    return "–" if x is None or x != x else f"{x:.{digits}f}"


def _complete(values: dict[str, float | None]) -> dict[str, float] | None:
    """The values when every one was measured, else None."""
    known = {k: v for k, v in values.items() if v is not None}
    return known if len(known) == len(values) else None


def relations(rows: list[dict]) -> list[tuple[str, bool, str]]:
    """(claim, holds, evidence) for the paper's orderings at each temperature."""
    by = {(r["task"], r["drafter"], r["temperature"]): r for r in rows}
    temps = sorted({r["temperature"] for r in rows})
    out = []
    for t in temps:
        tau = _complete({task: by.get((task, "dspark", t), {}).get("acceptance_length") for task in TASK_ORDER})
        if tau is not None:
            holds = tau["gsm8k"] > tau["humaneval"] > tau["mt_bench"]
            out.append((f"T={t:g}: DSpark τ GSM8K > HumanEval > MT-Bench", holds,
                        " > ".join(f"{_fmt(tau[k])}" for k in TASK_ORDER)))
        for task in TASK_ORDER:
            vals = _complete({d: by.get((task, d, t), {}).get("acceptance_length")
                              for d in ("dspark", "dflash", "eagle3")})
            if vals is None:
                continue
            holds = vals["dspark"] >= vals["dflash"] >= vals["eagle3"]
            out.append((f"T={t:g} {task}: DSpark ≥ DFlash ≥ Eagle3-style", holds,
                        " ≥ ".join(_fmt(vals[d]) for d in ("dspark", "dflash", "eagle3"))))
    for r in rows:
        if r["drafter"] == "dspark" and r["ece_raw"] is not None and r["ece_calibrated"] is not None:
            out.append((f"T={r['temperature']:g} {r['task']}: DSpark ECE calibrated < raw",
                        r["ece_calibrated"] < r["ece_raw"], f"{_fmt(r['ece_raw'], 3)} → {_fmt(r['ece_calibrated'], 3)}"))
    return out


def write_model_card(root: str | Path) -> Path:
    root = Path(root)
    target = json.loads((root / "target" / "training_report.json").read_text())
    data = json.loads((root / "measurements.json").read_text())
    lines = [
        "# Embedded default: tiny Qwen3 target and its drafts",
        "",
        "Built by `python -m recipes.embedded.build` from GSM8K train, Python's standard library and its",
        "documentation (no evaluation data); every figure below was measured by that build.",
        "",
        "## Target",
        "",
        f"- Qwen3 architecture, {target['num_params'] / 1e6:.2f} M parameters "
        f"({target['config'].get('num_layers', '?')} layers, hidden {target['config'].get('hidden_size', '?')}, "
        f"vocabulary {target['config'].get('vocab_size', '?')})",
        f"- trained {target['num_steps']} steps, {target['tokens_seen']:,} tokens, {target['train_seconds'] / 60:.1f} min "
        f"on {target.get('num_threads', '?')} CPU threads (time-limited: {target['time_limited']})",
        "- validation loss per domain (nats/token): "
        + ", ".join(f"{k} {v:.3f}" for k, v in target["val_loss"].items()),
        "",
    ]
    lines += draft_and_measurement_sections(data)
    path = root / "MODEL_CARD.md"
    path.write_text("\n".join(lines))
    return path


def drafts_table(drafts: list[dict]) -> list[str]:
    """The card's "Drafts" section from the build's DraftReports (asdict), any target. The held-out σ(c)
    column appears once a build records it (records from before it render as they did)."""
    promised = any(d.get("heldout_confidence") is not None for d in drafts)
    extra_head, extra_rule = (" held-out σ(c) |", "---|") if promised else ("", "")
    lines = [
        "## Drafts",
        "",
        f"| draft | method | head | trainable params | train s | loss first → last | held-out loss | held-out α |{extra_head} "
        "STS temperatures (level offsets) |",
        f"|---|---|---|---|---|---|---|---|{extra_rule}---|",
    ]
    for d in drafts:
        offsets = d.get("sts_offsets") or {}
        temps = "; ".join(f"T={k}: " + ", ".join(f"{t:.2f}" for t in v)
                          + (" (offsets " + ", ".join(f"{b:+.2f}" for b in offsets[k]) + ")" if k in offsets else "")
                          for k, v in (d["sts_temperatures"] or {}).items()) or "–"
        confidence = d.get("heldout_confidence")
        extra = ((" –" if confidence is None else f" {confidence:.3f}") + " |") if promised else ""
        lines.append(f"| {d['name']} | {d['method']} | {d['head']} | {d['num_params_trainable']:,} | {d['train_seconds']:.0f} "
                     f"| {d['loss_first']:.3f} → {d['loss_last']:.3f} | {d['heldout_loss']:.3f} | {d['heldout_acceptance']:.3f} |"
                     f"{extra} {temps} |")
    if promised:
        lines += ["", "Held-out σ(c): the confidence head's mean σ(c_k) over the held-out answers, weighted as held-out α "
                  "is. Above α, the head promises more acceptance than the draft gives on answers it was not trained on: "
                  "a level shift, which the STS temperatures barely move."]
    return lines


def draft_and_measurement_sections(data: dict) -> list[str]:
    """The drafts, acceptance/calibration/speed, relations and build-time sections of a card (any target)."""
    rows = data["measurements"]
    plain = {(r["task"], r["temperature"]): r["tokens_per_s"] for r in rows if r["drafter"] == "none"}
    lines = drafts_table(data["drafts"])
    g = rows[0]["gamma"] if rows else "?"
    n = rows[0]["num_prompts"] if rows else "?"
    lines += [
        "",
        f"## Acceptance, calibration and speed (γ = {g}, {n} generations per task; MT-Bench counts both turns)",
        "",
        "τ = 1 + accepted ÷ drafting steps (harness.metrics). α₁: first-position acceptance. Speed-up: tokens/s over",
        "plain decoding of the same prompts in the same run. ECE: DSpark confidences, raw → STS-calibrated.",
        "",
        "| task | T | draft | τ | α₁ | tokens/s | speed-up | ECE raw | ECE cal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {d: i for i, d in enumerate(DRAFT_ORDER)}
    for r in sorted(rows, key=lambda r: (TASK_ORDER.index(r["task"]) if r["task"] in TASK_ORDER else 9,
                                        r["temperature"], order.get(r["drafter"], 99))):
        base = plain.get((r["task"], r["temperature"]))
        speedup = r["tokens_per_s"] / base if base else None
        lines.append(f"| {r['task']} | {r['temperature']:g} | {r['drafter']} | {_fmt(r['acceptance_length'])} "
                     f"| {_fmt(r['first_position_acceptance'])} | {r['tokens_per_s']:.0f} | {_fmt(speedup)} "
                     f"| {_fmt(r['ece_raw'], 3)} | {_fmt(r['ece_calibrated'], 3)} |")
    lines += ["", "## The paper's relations, as measured here", ""]
    for claim, holds, evidence in relations(rows):
        lines.append(f"- {'holds' if holds else '**does not hold**'}: {claim} ({evidence})")
    secs = data["build"]["seconds"]
    lines += ["", f"Build time: {sum(secs.values()) / 60:.1f} min ("
              + ", ".join(f"{k} {v / 60:.1f}" for k, v in secs.items()) + ")", ""]
    return lines
