"""A draft build resumes: its target caches are kept under their key, and a draft trained with the same config is kept."""

from __future__ import annotations

import json
from dataclasses import asdict

import torch

from dspark_core.target_cache import TargetCache, TargetSequence
from dspark_core.training import TrainConfig
from recipes.embedded.drafts import DraftReport, _jsonable, _kept, _kept_draft


def _cache(n: int) -> TargetCache:
    seqs = [TargetSequence(torch.arange(6), torch.randn(6, 4), torch.randn(6, 8), 2) for _ in range(n)]
    return TargetCache(seqs, (1,), {"n": n})


def test_a_kept_cache_is_read_back_not_rebuilt_and_a_new_key_rebuilds(tmp_path):
    calls = []

    def build(n):
        calls.append(n)
        return _cache(n)

    first = _kept(tmp_path, "train", "k1", lambda _: None, lambda: build(3))
    again = _kept(tmp_path, "train", "k1", lambda _: None, lambda: build(5))
    assert calls == [3] and len(again) == 3
    assert torch.equal(again.sequences[0].features, first.sequences[0].features)
    other = _kept(tmp_path, "train", "k2", lambda _: None, lambda: build(5))  # another key: the settings changed
    assert calls == [3, 5] and len(other) == 5
    assert not list(tmp_path.glob("*.partial"))


def test_a_draft_is_kept_only_with_the_same_training_config(tmp_path):
    report = DraftReport("dspark", "dspark", "markov", 10, 1.0, 2.0, 1.0, 1.5, 0.4, {"1": [1.0]})
    cfg = TrainConfig(steps=300, seed=0)
    (tmp_path / "dspark").mkdir()
    (tmp_path / "dspark" / "draft_config.json").write_text(json.dumps(
        {"extra": {"training": asdict(report), "train_config": _jsonable(asdict(cfg))}}))
    assert _kept_draft(tmp_path / "dspark", cfg) == report
    assert _kept_draft(tmp_path / "dspark", TrainConfig(steps=301, seed=0)) is None
    assert _kept_draft(tmp_path / "dflash", cfg) is None



def test_an_eagle3_only_field_keeps_a_dspark_draft_and_retrains_an_eagle3_one(tmp_path):
    old = TrainConfig(steps=300, seed=0, eagle3_unroll_steps=2)
    new = TrainConfig(steps=300, seed=0, eagle3_unroll_steps=2, eagle3_anchors_per_sequence=56)
    for name, method in (("dspark", "dspark"), ("eagle3", "eagle3")):
        report = DraftReport(name, method, "none", 10, 1.0, 2.0, 1.0, 1.5, 0.4, None)
        (tmp_path / name).mkdir()
        stored = _jsonable(asdict(old))
        del stored["eagle3_anchors_per_sequence"]  # written before the field existed
        (tmp_path / name / "draft_config.json").write_text(json.dumps(
            {"extra": {"training": asdict(report), "train_config": stored}}))
    assert _kept_draft(tmp_path / "dspark", new) is not None
    assert _kept_draft(tmp_path / "eagle3", new) is None
    assert _kept_draft(tmp_path / "dspark", TrainConfig(steps=300, seed=1, eagle3_unroll_steps=2)) is None
