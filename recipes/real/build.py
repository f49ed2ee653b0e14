"""One command builds the drafts of a real target: target-generated cache, DSpark/DFlash/Eagle3-style, STS, card.

    python -m recipes.real.build models/smollm2-135m                  # the committed build (2 cores)
    python -m recipes.real.build /tmp/smollm2 --preset reduced        # CI: proves the script (slow test)

The recipe is the embedded default's (recipes/embedded/drafts.py, DeepSpec's): the target answers training
prompts itself — GSM8K train questions, stdlib code-completion prompts, chat prompts from Python's prose and
handwritten open-ended instructions (recipes/embedded/instructions.py, checked against MT-Bench); never an
evaluation set — half greedily and half at T = 1; one target forward per sequence records the features and the
log-probs at the draft vocabulary's candidate tokens only (dspark_core/target_cache.py: ≈ 22 KB per token
instead of ≈ 100 KB for all 49,152, so the default's 191 k answer tokens fit in memory); every draft trains on that one cache **with the same budget in tokens: the same optimiser steps over the
same sequences per step, and as many supervised positions per sequence** (DSpark/DFlash: `anchors_per_sequence`
blocks of γ; Eagle3-style: γ/2 as many anchors, each supervising its 2 unrolled steps); STS is fitted per
decoding temperature on held-out prompts.

The card is measured by the harness itself, not by a loop of the build's own: the build writes `card.yaml`
beside the drafts (the committed build names them `smollm2-135m:<name>`, a build elsewhere by absolute path), runs it with `harness run` into `card.duckdb`, and renders MODEL_CARD.md and card.json from that run
(harness/report/model_card.py: one τ, one ECE, the paired speedup, each with its interval). Rerun the card
alone on the committed drafts with `harness run models/smollm2-135m/card.yaml`.

Sizes, chosen so the repository stays under 48 MiB: one draft layer each with a 768-wide MLP (the target's is
1536), three target feature layers, Markov rank 128 with W1 over the draft vocabulary (8,193 rows, not 49,152:
4.2 MB for W1 and W2, where rank 32 over every target id took 3.7 MB), bf16 on disk, and the 49,152 × 576
embedding / LM head shared with the target (not stored). The draft vocabulary is the 8,192 tokens the target's cached answers use
most (dspark_core/draft_vocabulary.py; ≈ 90% of held-out answer tokens): a training step is then several times
cheaper than over 49,152 tokens, which buys the default its 2,000 steps over 256 prompts per domain (and 256
instructions in chat). The choice
is measured with `python -m recipes.real.ablate` (held-out α of drafts trained on one build's caches, per
vocabulary and step count). Drafts train in fp32 even where the target runs in bf16: bf16 autocast did not train
(recipes/embedded/drafts.py, `DraftPreset`), the likeliest cause of an earlier 8,192-token build's poor drafts
(held-out α 0.09) if it ran on a bf16 CPU, as this one does; its record does not say. Only the products of the
frozen LM head take the target's dtype (`TrainConfig.lm_head_dtype`, dspark_core/frozen_head.py): DSpark at 2,000
steps reached the same held-out α in bf16 as in fp32 (0.326, loss 2.306 against 2.305). With it, freed memory kept
(dspark_core/host_memory.py) and the loss's C++ terms (kernels/distill_loss_cpu.py), a DSpark training step here
is 0.62× what it was (283–288 ms against 451–475 on the Zen 4; docs/SMOLLM2_MEASUREMENTS.md).

Deterministic for a seed (seeded answers, seeded data order and initialisation) on the same torch build, CPU
kind, dtype and thread count. The target is the one `smollm2-135m` resolves to (the installed wheel's
conversion), run in bf16 where the CPU has native bf16 and in fp32 elsewhere (`--dtype`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dspark_core.native_dtype import fast_dtype
from dspark_core.training import TrainConfig
from recipes.embedded.corpus import CorpusCaps, build_corpus
from recipes.embedded.drafts import DRAFTS, DraftPreset, build_drafts, draft_inputs

REAL_DRAFTS = tuple(d for d in DRAFTS if d.name != "dspark-rnn")  # dspark (Markov), dflash, eagle3; one layer each
REAL_DRAFTS = tuple(replace(d, num_layers=1) for d in REAL_DRAFTS)

PRESETS_BLOCK_SIZE = 7  # γ of every card cell: the drafts' block size
_COMMON: dict[str, Any] = dict(num_target_features=3, intermediate_size=768, mask_token="<empty_output>",
                               block_size=PRESETS_BLOCK_SIZE, markov_rank=128, markov_w1_rows="draft")


def _equal_positions(anchors_per_sequence: int, unroll_steps: int) -> int:
    """Eagle3-style anchors per sequence that supervise as many positions as DSpark's blocks: a DSpark block
    supervises γ positions, an Eagle3 anchor one per unrolled step."""
    return anchors_per_sequence * PRESETS_BLOCK_SIZE // unroll_steps


@dataclass(frozen=True)
class CardPreset:
    """The card suite: every draft at γ = block size, policy full, on the three tasks, in `rounds` paired rounds.
    Speed at concurrency 1 where the goals are stated (T = 0, `speed_tasks`); τ and ECE need no low load, so
    the other points (T = 0 on the other tasks, every task at T = 1) run at `sampled_concurrency`, which is
    several times faster. 10 samples × 72 tokens × 2 rounds give ≈ 22,000 distinct DSpark confidences at T = 1 over
    the three tasks (each round draws its own seeds, `Cell.request_seed`; one round gave 11,725).
    `sampled_drafters` run at T = 1: all of them in the committed card; the trained drafts alone (τ and ECE are
    theirs to measure) cut the card from 30 cells to 24 (28.7 min measured, build 66.6 min in all)."""

    tasks: tuple[str, ...] = ("gsm8k", "humaneval", "mt_bench")
    drafters: tuple[str, ...] = ("none", "ngram", "dspark", "dflash", "eagle3")
    speed_tasks: tuple[str, ...] = ("gsm8k", "mt_bench")
    n_samples: int = 10
    max_new_tokens: int = 72
    rounds: int = 2
    sampled_concurrency: int = 8
    sampled_drafters: tuple[str, ...] = ("none", "ngram", "dspark", "dflash", "eagle3")


@dataclass(frozen=True)
class RealPreset:
    caps: CorpusCaps
    drafts: DraftPreset
    card: CardPreset


PRESETS = {
    "default": RealPreset(
        caps=CorpusCaps(math_chars=400_000, code_chars=400_000, chat_chars=400_000, num_val=48),
        drafts=DraftPreset(
            prompts_per_domain=256, instruction_prompts=256, max_new_tokens=128, sts_prompts_per_domain=48,
            cache_batch_size=32, draft_vocab_size=8192,
            train=TrainConfig(steps=2000, lr=2e-3, batch_size=8, anchors_per_sequence=16, eagle3_unroll_steps=2,
                              eagle3_anchors_per_sequence=_equal_positions(16, 2)),
            **_COMMON,
        ),
        card=CardPreset(),
    ),
    "reduced": RealPreset(
        caps=CorpusCaps(math_chars=20_000, code_chars=20_000, chat_chars=20_000, num_val=4),
        drafts=DraftPreset(
            prompts_per_domain=4, instruction_prompts=2, max_new_tokens=24, sts_prompts_per_domain=2, cache_batch_size=12,
            draft_vocab_size=2048,
            train=TrainConfig(steps=4, lr=2e-3, batch_size=4, anchors_per_sequence=4, eagle3_unroll_steps=2,
                              eagle3_anchors_per_sequence=_equal_positions(4, 2)),
            **_COMMON,
        ),
        card=CardPreset(tasks=("gsm8k",), speed_tasks=("gsm8k",), n_samples=2, max_new_tokens=12, rounds=1,
                        sampled_concurrency=2),
    ),
}


def resolved_preset(preset: str, dtype: str = "auto") -> RealPreset:
    """The preset with its target dtype chosen (`auto`: `fast_dtype()`). The drafts train in fp32 whatever it is,
    but for the products of their frozen LM head, which take the target's dtype: in bf16 they are a step's largest
    saving (dspark_core/frozen_head.py), and the drafts run in that dtype once trained."""
    dtype = fast_dtype() if dtype == "auto" else dtype
    p = PRESETS[preset]
    return replace(p, drafts=replace(p.drafts, target_dtype=dtype, train=replace(p.drafts.train, lm_head_dtype=dtype)))


def build(out_dir: str | Path, *, target: str = "smollm2-135m", preset: str = "default", seed: int = 0,
          data_dir: str | None = None, overwrite: bool = False, num_threads: int = 2, dtype: str = "auto",
          resume: bool = False, log=print) -> dict:
    from inputs import model_refs

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not resume:
        if not overwrite:
            raise FileExistsError(f"{out} exists and is not empty (pass --resume to finish it, --overwrite to rebuild it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(num_threads)
    p = resolved_preset(preset, dtype)
    dtype = p.drafts.target_dtype
    target_dir = model_refs.resolve(target).path
    seconds: dict[str, float] = {}

    start = time.perf_counter()
    corpus = build_corpus(data_dir, p.caps)
    inputs = draft_inputs(target_dir, corpus, preset=p.drafts, seed=seed, drafts=REAL_DRAFTS, log=log, work_dir=out / "work")
    reports = build_drafts(inputs, out / "drafts", log=log)
    seconds["drafts"] = time.perf_counter() - start

    card_suite = write_card_suite(out, p.card, target=target, dtype=dtype, num_threads=num_threads, seed=seed)
    start = time.perf_counter()
    run_id = run_card(card_suite, out / "card.duckdb", data_dir=data_dir, log=log,
                      drafts=drafts_fingerprint(out / "drafts"), resume=resume)
    seconds["card"] = time.perf_counter() - start
    summary = {
        "build": {"target": target, "out_dir": str(out_dir), "target_source": _source(target_dir), "preset": preset, "seed": seed,
                  "num_threads": num_threads, "dtype": dtype, "cpu": torch.backends.cpu.get_cpu_capability(),
                  "seconds": seconds, "resumed": resume, "corpus": corpus.fingerprint(),
                  "torch": torch.__version__,
                  "training_budget": _budget(p.drafts.train)},
        "drafts": [asdict(r) for r in reports],
        "card_run": run_id,
    }
    (out / "build.json").write_text(json.dumps(summary, indent=2))
    from recipes.real.card import write_card

    write_card(out)
    return summary


def _budget(train: TrainConfig) -> str:
    per_sequence = train.anchors_per_sequence * PRESETS_BLOCK_SIZE
    return (f"equal tokens: {train.steps} steps × {train.batch_size} sequences × up to {per_sequence} supervised positions "
            f"per sequence for every draft (DSpark/DFlash: {train.anchors_per_sequence} blocks of γ {PRESETS_BLOCK_SIZE}; "
            f"Eagle3-style: {train.eagle3_anchors_per_sequence} anchors × {train.eagle3_unroll_steps} unrolled steps)")


def write_card_suite(out: Path, card: CardPreset, *, target: str, dtype: str, num_threads: int, seed: int) -> Path:
    """`out/card.yaml`: the suite the card is measured by (data, written once per build)."""
    import yaml

    from inputs.model_refs import real_drafts_root

    # The committed build names its drafts as any suite does (`smollm2-135m:<name>`); a build elsewhere by
    # absolute path (suite paths are taken from the working directory, so a relative one would not resolve).
    committed = out.resolve() == real_drafts_root(target).parent.resolve()
    drafters = {"none": {"method": "none"}, "ngram": {"method": "ngram"}}
    for d in REAL_DRAFTS:
        ref = f"{target}:{d.name}" if committed else str((out / "drafts" / d.name).resolve())
        drafters[d.name] = {"method": d.method, "checkpoint": ref}
    tasks = {t: {"n_samples": card.n_samples, "max_new_tokens": card.max_new_tokens, "temperature": 0,
                 **({"multi_turn": True} if t == "mt_bench" else {})} for t in card.tasks}
    suite = {
        "version": 1,
        "name": f"{target}-card",
        "description": f"The model card of {target}'s drafts: τ, per-position acceptance, ECE and speedups.",
        "defaults": {"backend": "inhouse", "seed": seed, "warmup": 1, "repeats": card.rounds, "policy": "full"},
        "targets": {"target": {"path": target, "dtype": dtype}},
        "drafters": {k: v for k, v in drafters.items() if k in card.drafters},
        "tasks": tasks,
        "matrix": {
            "backend": ["inhouse"], "target": ["target"], "drafter": list(card.drafters),
            "num_drafts": [PRESETS_BLOCK_SIZE], "task": [t for t in card.tasks if t in card.speed_tasks],
            "temperature": [0], "concurrency": [1],
            "include": [{"drafter": d, "task": t, "temperature": temp, "concurrency": card.sampled_concurrency}
                        for temp in (0, 1) for t in card.tasks for d in card.drafters
                        if (temp == 1 and d in card.sampled_drafters) or (temp == 0 and t not in card.speed_tasks)],
        },
        "validity": {"min_requests": 1, "min_duration_s": 0.0, "max_failed_fraction": 0.0},
        "backend_options": {"inhouse": {"num_threads": num_threads, "max_context": 2048}},
    }
    path = out / "card.yaml"
    header = ("# Written by `python -m recipes.real.build` (recipes/real/build.py, write_card_suite): the suite its\n"
              "# MODEL_CARD.md was measured by. Run it again with `harness run` on this file.\n")
    path.write_text(header + yaml.safe_dump(suite, sort_keys=False, width=120, default_flow_style=None))
    return path


def drafts_fingerprint(drafts_dir: Path) -> str:
    """sha256 over the drafts' files: the card run that measured exactly these drafts carries it."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(Path(drafts_dir).rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(drafts_dir)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def run_card(suite: Path, db: Path, *, data_dir: str | None, log, drafts: str = "", resume: bool = False,
             progress: bool = False) -> str:
    """Run the card suite through the harness runner; returns the run id. The run is stamped with the drafts'
    fingerprint; with `resume`, a card run of these same drafts is reused when finished and resumed when not
    (an interrupted build loses no measured cell). A card run that does not finish raises: a card is
    never rendered from part of its suite. `progress`: a line per cell, as `harness run` prints them."""
    import os

    from harness.progress import PlainDisplay
    from harness.runner import run_suite

    earlier = _earlier_card_run(db, drafts, suite) if resume else None
    if earlier is not None and earlier["status"] == "finished":
        log(f"card run {earlier['run_id']}: kept from an earlier run of this build (the same drafts)")
        return earlier["run_id"]
    previous = os.environ.get("HARNESS_DATA_DIR")
    if data_dir is not None:
        os.environ["HARNESS_DATA_DIR"] = str(data_dir)
    try:
        outcome = run_suite(suite, db_path=db, display=PlainDisplay(quiet=not progress), metadata={"drafts": drafts},
                            resume=earlier["run_id"] if earlier is not None else None)
    finally:
        if data_dir is not None:
            if previous is None:
                os.environ.pop("HARNESS_DATA_DIR", None)
            else:
                os.environ["HARNESS_DATA_DIR"] = previous
    failed = [o for o in outcome.outcomes if o.status == "failed"]
    log(f"card run {outcome.run_id}: {len(outcome.outcomes)} cells, {len(failed)} failed")
    if outcome.run_id is None:
        raise RuntimeError(f"the card suite {suite} did not run")
    if outcome.interrupted:
        raise RuntimeError(f"card run {outcome.run_id} was interrupted; no card was written. Finish it with the "
                           "same build command and --resume")
    return outcome.run_id


def _earlier_card_run(db: Path, drafts: str, suite: Path) -> dict | None:
    """The newest run in `db` of this very card suite stamped with these drafts' fingerprint (any status), else None."""
    from harness.store import Store
    from harness.suite.load import load_suite

    if not db.is_file():
        return None
    suite_hash = load_suite(suite).hash
    with Store.open(db, read_only=True) as store:
        for run in store.runs():
            if run.get("suite_hash") != suite_hash:
                continue
            metadata = run.get("metadata") or {}
            if isinstance(metadata, str):
                metadata = json.loads(metadata)
            if metadata.get("drafts") == drafts:
                return run
    return None


def _source(target_dir: Path) -> dict:
    path = target_dir / "source.json"
    return json.loads(path.read_text()) if path.exists() else {"path": str(target_dir)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.real.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                        help="target forwards (auto: bf16 only where the CPU has native bf16); drafts train in fp32")
    parser.add_argument("--data-dir", default=None, help="dataset directory (default: $HARNESS_DATA_DIR)")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--resume", action="store_true",
                        help="finish an interrupted build in OUT_DIR: keep its target caches (OUT_DIR/work) and trained drafts")
    args = parser.parse_args(argv)
    summary = build(args.out_dir, target=args.target, preset=args.preset, seed=args.seed, data_dir=args.data_dir,
                    overwrite=args.overwrite, resume=args.resume, num_threads=args.threads, dtype=args.dtype, log=lambda line: print(line, flush=True))
    print(f"built {args.out_dir} in {sum(summary['build']['seconds'].values()) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
