"""The committed embedded default: it loads without training, its trained drafts are lossless and
really accept, and the build script that made it still works (a reduced rebuild, marked slow)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from dspark_core.drafters import NoDrafter
from dspark_core.generate import GenerationConfig, generate
from recipes.embedded.card import relations
from inputs.model_refs import embedded_root
from recipes.embedded.evaluate import load_embedded
from inputs.tasks.prompts import stop_tokens

ROOT = embedded_root()
DRAFTS = ("dspark", "dspark-rnn", "dflash", "eagle3")
needs_build = pytest.mark.skipif(not (ROOT / "target" / "config.json").exists(), reason=f"no embedded default at {ROOT}")


@pytest.fixture(scope="module")
def embedded():
    return load_embedded(ROOT, ["none", "ngram", *DRAFTS])


@pytest.fixture(scope="module")
def task_prompts(embedded):
    """Two prompts per task, rendered through the chat template as the harness does."""
    from inputs.tasks import load_task, prompt_ids

    data_dir = Path(os.environ.get("HARNESS_DATA_DIR") or ROOT.parents[2] / "shared" / "datasets")
    if not (data_dir / "gsm8k" / "test.jsonl").exists():
        pytest.skip(f"no datasets under {data_dir} (set HARNESS_DATA_DIR)")
    prompts = []
    for task in ("gsm8k", "humaneval", "mt_bench"):
        data = load_task(task, n_samples=2, seed=3, data_dir=data_dir)
        prompts += [prompt_ids(embedded.tokenizer, data.spec, s) for s in data.samples]
    return prompts


@needs_build
def test_committed_build_is_complete_and_small():
    for name in DRAFTS:
        config = json.loads((ROOT / "drafts" / name / "draft_config.json").read_text())
        assert config["method"] in ("dspark", "dflash", "eagle3")
    card = (ROOT / "MODEL_CARD.md").read_text()
    assert "## The paper's relations, as measured here" in card
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    assert total < 50 * 2**20, f"embedded default is {total / 2**20:.1f} MiB; keep it well under 50"


@needs_build
@pytest.mark.parametrize("gamma", [1, 3, 7])
def test_trained_drafts_are_lossless_under_greedy(embedded, task_prompts, gamma):
    config = GenerationConfig(max_new_tokens=24, num_drafts=gamma, stop_token_ids=stop_tokens(embedded.tokenizer))
    plain = [r.output_ids for r in generate(embedded.target, NoDrafter(), task_prompts, config)]
    for name in ("ngram", *DRAFTS):
        results = generate(embedded.target, embedded.drafters[name], task_prompts, config)
        assert [r.output_ids for r in results] == plain, name


@needs_build
def test_trained_dspark_draft_accepts(embedded, task_prompts):
    """A trained draft must do better than chance: mean tokens per step well above 1 at T = 0."""
    config = GenerationConfig(max_new_tokens=32, num_drafts=7, stop_token_ids=stop_tokens(embedded.tokenizer))
    results = generate(embedded.target, embedded.drafters["dspark"], task_prompts, config)
    steps = sum(r.counters.num_steps for r in results)
    emitted = sum(a + 1 for r in results for a in r.counters.num_accepted)
    assert steps > 0 and emitted / steps > 1.5
    assert all(len(c) == v for r in results for c, v in zip(r.counters.confidence_logits, r.counters.num_verified))


def test_card_relations_report_failures_with_numbers():
    def row(task, drafter, tau, t=1.0, ece=None, cal=None):
        return {"task": task, "drafter": drafter, "temperature": t, "acceptance_length": tau,
                "ece_raw": ece, "ece_calibrated": cal}

    rows = [row("gsm8k", "dspark", 5.0, ece=0.05, cal=0.01), row("humaneval", "dspark", 4.0),
            row("mt_bench", "dspark", 4.5), row("gsm8k", "dflash", 4.0), row("gsm8k", "eagle3", 4.2)]
    found = {claim: (holds, evidence) for claim, holds, evidence in relations(rows)}
    assert found["T=1: DSpark τ GSM8K > HumanEval > MT-Bench"] == (False, "5.00 > 4.00 > 4.50")
    assert found["T=1 gsm8k: DSpark ≥ DFlash ≥ Eagle3-style"] == (False, "5.00 ≥ 4.00 ≥ 4.20")
    assert found["T=1 gsm8k: DSpark ECE calibrated < raw"][0] is True


@pytest.mark.slow
def test_reduced_rebuild(tmp_path):
    """CI proves the one-command rebuild works end to end (reduced sizes, a few minutes on 2 cores)."""
    from recipes.embedded.build import build

    data_dir = Path(os.environ.get("HARNESS_DATA_DIR") or ROOT.parents[2] / "shared" / "datasets")
    if not (data_dir / "gsm8k" / "train.jsonl").exists():
        pytest.skip(f"no datasets under {data_dir}")
    threads = torch.get_num_threads()
    try:
        report = build(tmp_path / "embedded", preset="reduced", data_dir=str(data_dir))
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "embedded"
    emb = load_embedded(out)
    assert set(DRAFTS) <= set(emb.drafters)
    rows = json.loads((out / "measurements.json").read_text())["measurements"]
    assert {r["task"] for r in rows} == {"gsm8k", "humaneval", "mt_bench"}
    assert (out / "MODEL_CARD.md").read_text().count("| gsm8k |") >= len(DRAFTS)
    assert set(report.seconds) == {"target", "drafts", "evaluation"}
