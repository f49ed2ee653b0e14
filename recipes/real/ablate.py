"""Which training choice makes a better draft: held-out acceptance for drafts trained on one build's caches.

    python -m recipes.real.ablate models/smollm2-135m --methods dspark --vocab 8192 4096 --steps 300 600
    python -m recipes.real.ablate models/smollm2-135m --methods dspark --layers 1 2 --markov-rank 32 64
    python -m recipes.real.ablate models/smollm2-135m --methods dspark --sequences 256 512
    python -m recipes.real.ablate models/smollm2-135m --methods dspark --markov-rank 256 --w1-rows draft target
    python -m recipes.real.ablate /tmp/five --methods dspark --target-features 5

Every row trains one draft exactly as the build does (`recipes.embedded.drafts.train_one`: same caches, same
seed, same preset but for the varied fields: vocabulary, steps, draft layers, Markov rank and W1 rows, training
sequences, target layers fed to the draft)
and scores it on the build's held-out cache: held-out loss, α (the analytic T = 1 acceptance per position, what τ
grows with) and the coverage of a reduced vocabulary. `--sequences N` trains on a seeded random N of the cache's
answers, the vocabulary still chosen from all of them so that only the training data varies: how α falls with
half the data estimates what more target answers would buy, without generating them. `--target-features N`
feeds the drafts N target layers (`default_target_layer_ids`; the build's preset: 3): the caches hold those
layers' hidden states, so another N needs caches of its own (keyed by the layers, built in OUT_DIR/work, as
long as a build's) and takes one N per run. The target
caches are read from OUT_DIR/work where a build (or an earlier ablation) kept them, else built there. A preset
with a draft vocabulary keeps compact caches (log-probabilities at its draft_vocab_size tokens only), which
train that vocabulary or a smaller one; `--vocab full` needs a preset without one, and a size the caches cannot
train is refused before the first row. Nothing is written to OUT_DIR/drafts: the table goes to stdout
and OUT_DIR/ablation.jsonl (one JSON row per draft, appended), so a choice made from it can be cited.

α is deterministic for a seed, so rows compare without pairing; the seconds column is one unpaired
measurement of training time, a guide to cost and not a ratio to quote.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dspark_core.target_cache import TargetCache
from recipes.embedded.corpus import build_corpus
from recipes.embedded.drafts import draft_inputs, train_one
from recipes.real.build import PRESETS, REAL_DRAFTS, resolved_preset


@dataclass(frozen=True)
class AblationRow:
    method: str
    draft_vocab_size: int | None  # None: the target's whole vocabulary
    steps: int
    num_layers: int
    markov_rank: int  # the config's (a draft without a Markov head ignores it)
    train_sequences: int  # answers of the training cache the draft trained on
    vocab_coverage: float | None
    heldout_loss: float
    heldout_ce: float
    heldout_acceptance: float
    train_seconds: float
    seed: int
    heldout_confidence: float | None = None  # DSpark's confidence head: its held-out mean σ(c), beside held-out α
    markov_w1_rows: str = "target"  # the trained config's (`DraftConfig.markov_w1_rows`)
    lm_head_dtype: str = "float32"  # the frozen LM head's products while it trained (`TrainConfig.lm_head_dtype`)
    num_target_features: int | None = None  # target layers fed to the draft (None: recorded before this field)


def parse_vocab(value: str) -> int | None:
    if value == "full":
        return None
    size = int(value)
    if size <= 0:
        raise argparse.ArgumentTypeError(f"--vocab takes 'full' or a positive token count, not {value!r}")
    return size


def positive_count(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"takes a positive count, not {value!r}")
    return int(value)


def ablate(out_dir: str | Path, *, methods: list[str], vocabs: list[int | None], steps: list[int], preset: str = "default", target: str = "smollm2-135m",
           seed: int = 0, data_dir: str | None = None, num_threads: int = 2, dtype: str = "auto", log=print,
           layers: list[int] | None = None, ranks: list[int] | None = None,
           sequences: list[int] | None = None, w1_rows: list[str] | None = None,
           target_features: int | None = None) -> list[AblationRow]:
    """One row per (method, vocabulary, steps, layers, Markov rank, W1 rows, training sequences); `layers` /
    `ranks` / `w1_rows` / `sequences` / `target_features` None: the preset's (all of the cache's sequences)."""
    from inputs import model_refs

    out = Path(out_dir)
    torch.set_num_threads(num_threads)
    p = resolved_preset(preset, dtype)
    if target_features is not None:
        if target_features < 1:
            raise ValueError(f"--target-features takes a positive count, not {target_features}")
        p = replace(p, drafts=replace(p.drafts, num_target_features=target_features))
    specs = {d.name: d for d in REAL_DRAFTS}
    unknown = sorted(set(methods) - set(specs))
    if unknown:
        raise ValueError(f"--methods: unknown draft(s) {', '.join(unknown)} (valid: {', '.join(specs)})")
    corpus = build_corpus(data_dir, p.caps)
    inputs = draft_inputs(model_refs.resolve(target).path, corpus, preset=p.drafts, seed=seed, drafts=REAL_DRAFTS,
                          log=log, work_dir=out / "work")
    for vocab in vocabs:  # every row's vocabulary is checked against the caches before the first row trains
        inputs.check_vocabulary(vocab)
    too_many = [n for n in sequences or () if n > len(inputs.cache)]
    if too_many:
        raise ValueError(f"--sequences {too_many[0]}: the training cache holds {len(inputs.cache)} sequences")
    for vocab in vocabs:  # chosen from the whole cache before any subset, so a subset varies the data alone
        if vocab is not None:
            inputs.vocabulary(vocab)
    rows = []
    for name in methods:
        base = inputs.configs[name]
        for num_layers, rank, w1 in itertools.product(layers or [base.num_layers], ranks or [base.markov_rank],
                                                        w1_rows or [p.drafts.markov_w1_rows]):
            shaped = replace(inputs, preset=replace(inputs.preset, markov_w1_rows=w1),
                             configs={**inputs.configs, name: replace(base, num_layers=num_layers, markov_rank=rank)})
            for vocab, n, count in itertools.product(vocabs, steps, sequences or [len(inputs.cache)]):
                start = time.perf_counter()
                data = replace(shaped, cache=training_subset(inputs.cache, count, seed))
                trained = train_one(data, specs[name], replace(p.drafts.train, steps=n, seed=seed), vocab)
                row = AblationRow(name, vocab, n, num_layers, rank, count, trained.vocab_coverage,
                                  float(trained.heldout.total), trained.heldout.ce, trained.heldout.acceptance,
                                  time.perf_counter() - start, seed, trained.heldout_confidence,
                                  trained.model.config.markov_w1_rows, p.drafts.train.lm_head_dtype,
                                  trained.model.config.num_target_features)
                rows.append(row)
                log(format_row(row))
                with (out / "ablation.jsonl").open("a") as f:
                    f.write(json.dumps({**row.__dict__, "preset": preset, "dtype": p.drafts.target_dtype}) + "\n")
    return rows


def training_subset(cache: TargetCache, count: int, seed: int) -> TargetCache:
    """A seeded random `count` of the cache's sequences, in cache order (the whole cache, unchanged, at its size).
    Random rather than the first `count`: the cache lists the greedy half before the sampled one."""
    if count >= len(cache):
        return cache
    keep = sorted(random.Random(seed).sample(range(len(cache)), count))
    return replace(cache, sequences=[cache.sequences[i] for i in keep])


HEADER = ("| draft | vocab | steps | layers | rank | W1 rows | features | sequences | coverage | held-out loss | held-out CE "
          "| held-out α | held-out σ(c) | train s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def format_row(r: AblationRow) -> str:
    coverage = "1" if r.vocab_coverage is None else f"{r.vocab_coverage:.3f}"
    promised = "–" if r.heldout_confidence is None else f"{r.heldout_confidence:.3f}"
    return (f"| {r.method} | {r.draft_vocab_size or 'full'} | {r.steps} | {r.num_layers} | {r.markov_rank} | {r.markov_w1_rows} | "
            f"{r.num_target_features or '–'} | {r.train_sequences} | {coverage} | "
            f"{r.heldout_loss:.3f} | {r.heldout_ce:.3f} | {r.heldout_acceptance:.3f} | {promised} | {r.train_seconds:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.real.ablate", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="a build directory: its work/ holds (or will hold) the target caches")
    parser.add_argument("--methods", nargs="+", default=["dspark"], choices=[d.name for d in REAL_DRAFTS], help="drafts to train")
    parser.add_argument("--vocab", nargs="+", type=parse_vocab, default=None,
                        help="draft vocabulary sizes: 'full' or a count (default: the preset's)")
    parser.add_argument("--steps", nargs="+", type=int, default=None, help="optimiser steps (default: the preset's)")
    parser.add_argument("--layers", nargs="+", type=positive_count, default=None, help="draft decoder layers (default: the build's)")
    parser.add_argument("--markov-rank", nargs="+", type=positive_count, default=None,
                        help="rank r of DSpark's Markov head and confidence input (default: the preset's)")
    parser.add_argument("--w1-rows", nargs="+", choices=["target", "draft"], default=None,
                        help="Markov W1 indexed by every target token or by the draft vocabulary (default: the preset's)")
    parser.add_argument("--sequences", nargs="+", type=positive_count, default=None,
                        help="train on a seeded random N of the training cache's sequences (default: all of them)")
    parser.add_argument("--target-features", type=positive_count, default=None,
                        help="target layers fed to the drafts (default: the preset's); needs its own target caches")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    parser.add_argument("--data-dir", default=None, help="dataset directory (default: $HARNESS_DATA_DIR)")
    args = parser.parse_args(argv)
    steps = args.steps or [PRESETS[args.preset].drafts.train.steps]
    vocabs = args.vocab or [PRESETS[args.preset].drafts.draft_vocab_size]
    print(HEADER, flush=True)
    try:
        ablate(args.out_dir, methods=args.methods, vocabs=vocabs, steps=steps, preset=args.preset, target=args.target,
               seed=args.seed, data_dir=args.data_dir, num_threads=args.threads, dtype=args.dtype,
               log=lambda line: print(line, flush=True), layers=args.layers, ranks=args.markov_rank,
               sequences=args.sequences, w1_rows=args.w1_rows, target_features=args.target_features)
    except ValueError as e:  # a vocabulary the caches cannot train, an unknown draft: one line, not a traceback
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
