"""One command rebuilds the embedded default from the data: target, drafts, STS, measurements, model card.

    python -m recipes.embedded.build models/embedded                 # ≤ 30 min on 2 cores
    python -m recipes.embedded.build /tmp/embedded --preset reduced  # CI: proves the script works

Deterministic for a seed on a machine fast enough to finish the target's planned steps (the target's
wall-clock guard anneals early on slower ones and says so in its report). The output directory:
`target/` (a Hugging Face Qwen3 directory), `drafts/<name>/` (safetensors + draft_config.json with
STS temperatures), `measurements.json` and `MODEL_CARD.md`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from recipes.embedded.card import write_model_card
from recipes.embedded.corpus import build_corpus
from recipes.embedded.drafts import DRAFT_PRESETS, build_drafts, draft_inputs
from recipes.embedded.evaluate import EVAL_PRESETS, evaluate_embedded
from recipes.embedded.target import PRESETS, train_target


@dataclass(frozen=True)
class BuildReport:
    preset: str
    seed: int
    seconds: dict


def store_bf16(target_dir: Path) -> None:
    """Rewrite the target's weights in bf16 (half the bytes in git). Drafts are trained and every
    figure measured against the stored weights, loaded back in fp32, so nothing is measured on a
    model other than the one committed."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(str(target_dir))  # type: ignore[arg-type]  # transformers types .to as its decorator


def build(out_dir: str | Path, *, preset: str = "default", seed: int = 0, data_dir: str | None = None,
          overwrite: bool = False, num_threads: int = 2) -> BuildReport:
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} exists and is not empty (pass --overwrite to rebuild it)")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    torch.set_num_threads(num_threads)
    seconds: dict[str, float] = {}

    start = time.perf_counter()
    train_target(out / "target", data_dir=data_dir, seed=seed, preset=preset, num_threads=num_threads)
    store_bf16(out / "target")
    seconds["target"] = time.perf_counter() - start

    start = time.perf_counter()
    corpus = build_corpus(data_dir, PRESETS[preset].caps)
    reports = build_drafts(draft_inputs(out / "target", corpus, preset=DRAFT_PRESETS[preset], seed=seed), out / "drafts")
    seconds["drafts"] = time.perf_counter() - start

    start = time.perf_counter()
    measurements = evaluate_embedded(out, EVAL_PRESETS[preset])
    seconds["evaluation"] = time.perf_counter() - start

    report = BuildReport(preset=preset, seed=seed, seconds=seconds)
    (out / "measurements.json").write_text(json.dumps(
        {"build": asdict(report), "drafts": [asdict(r) for r in reports], "measurements": [m.row() for m in measurements]},
        indent=2,
    ))
    write_model_card(out)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.embedded.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None, help="dataset directory (default: $HARNESS_DATA_DIR)")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    report = build(args.out_dir, preset=args.preset, seed=args.seed, data_dir=args.data_dir, overwrite=args.overwrite)
    print(f"built {args.out_dir} in {sum(report.seconds.values()) / 60:.1f} min: {report.seconds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
