"""Fit a build's calibration again on the drafts as they are: STS temperatures and level offsets, weights unchanged.

    python -m recipes.real.calibrate models/smollm2-135m      # then: python -m recipes.real.card models/smollm2-135m

For drafts built before the build fitted level offsets (`dspark_core.calibration.fit_sts_level`), or whose
calibration is stale because the engine's roundings moved, retraining (≈ 75 min) is not needed. It runs the build's own fit (`recipes.embedded.drafts.fit_calibration`: the same held-out prompts, seed,
γ and answer length as the build's preset) on every draft with a confidence head and rewrites only its
`draft_config.json` (the temperatures and offsets in `extra`, and in the draft's training record) and the
build's record of it in `build.json`. The card is then stale: measure it again with `recipes.real.card`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def recalibrate(root: str | Path, *, data_dir: str | None = None, num_threads: int = 2, log=print) -> dict[str, dict]:
    """Refit every confidence-head draft of the build in `root`; returns {draft: {"temperatures", "offsets"}}."""
    import torch
    from transformers import AutoTokenizer

    from dspark_core.checkpoint import CONFIG_FILE, load_draft
    from dspark_core.drafters.config import DraftConfig
    from dspark_core.target import TargetModel
    from inputs import model_refs
    from recipes.embedded.corpus import build_corpus
    from recipes.embedded.drafts import fit_calibration
    from recipes.real.build import resolved_preset

    root = Path(root)
    record = root / "build.json"
    if not record.exists():
        raise FileNotFoundError(f"{record}: missing; a calibration is fitted on a build's drafts "
                                f"(python -m recipes.real.build {root})")
    data = json.loads(record.read_text())
    build = data["build"]
    torch.set_num_threads(num_threads)
    preset = resolved_preset(build["preset"], build.get("dtype", "auto"))
    corpus = build_corpus(data_dir, preset.caps)
    if corpus.fingerprint() != build["corpus"]:
        raise ValueError(f"the corpus here ({corpus.fingerprint()[:16]}…) is not the build's ({build['corpus'][:16]}…): "
                         "its held-out prompts would not be the build's; check HARNESS_DATA_DIR")
    target_dir = model_refs.resolve(build["target"]).path
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target = TargetModel.from_pretrained(target_dir, dtype=getattr(torch, preset.drafts.target_dtype))
    fitted: dict[str, dict] = {}
    for report in data["drafts"]:
        directory = root / "drafts" / report["name"]
        model = load_draft(directory, dtype=target.dtype, target=target)
        if not model.config.confidence_head:
            continue
        target.set_layer_ids(model.config.target_layer_ids)
        start = time.perf_counter()
        temps, offsets = fit_calibration(target, model, tokenizer, corpus, preset.drafts, build["seed"])
        log(f"{report['name']}: " + "; ".join(
            f"T={k}: temperatures " + ", ".join(f"{t:.2f}" for t in temps[k]) + " offsets "
            + ", ".join(f"{b:+.2f}" for b in offsets[k]) for k in temps) + f" ({time.perf_counter() - start:.0f} s)")
        config_path = directory / CONFIG_FILE
        config = DraftConfig.load(config_path)
        for holder in (config.extra, config.extra.get("training", {}), report):
            holder["sts_temperatures"], holder["sts_offsets"] = temps, offsets
        config_path.write_text(config.to_json() + "\n")  # as `save_draft` writes it
        fitted[report["name"]] = {"temperatures": temps, "offsets": offsets}
    data["calibration_refit"] = {"drafts": sorted(fitted), "torch": torch.__version__,
                                 "cpu": torch.backends.cpu.get_cpu_capability()}
    record.write_text(json.dumps(data, indent=2))
    return fitted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.real.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="a build directory (build.json, drafts/), e.g. models/smollm2-135m")
    parser.add_argument("--data-dir", default=None, help="datasets directory (default: HARNESS_DATA_DIR)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        fitted = recalibrate(args.root, data_dir=args.data_dir, num_threads=args.threads)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"refitted {', '.join(fitted) or 'nothing (no draft has a confidence head)'}; the card is now stale: "
          f"python -m recipes.real.card {args.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
