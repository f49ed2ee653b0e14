"""A draft build resumes: its target caches are kept under their key, and a draft trained with the same config is kept."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import torch

from dspark_core.drafters.config import DraftConfig
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



def test_a_training_field_added_since_reads_as_its_default(tmp_path):
    """A draft written before `lm_head_dtype` existed trained its head in fp32: kept for a float32 config, trained
    again for a bfloat16 one."""
    report = DraftReport("dspark", "dspark", "markov", 10, 1.0, 2.0, 1.0, 1.5, 0.4, None)
    stored = _jsonable(asdict(TrainConfig(steps=300, seed=0)))
    del stored["lm_head_dtype"]
    (tmp_path / "dspark").mkdir()
    (tmp_path / "dspark" / "draft_config.json").write_text(json.dumps(
        {"extra": {"training": asdict(report), "train_config": stored}}))
    assert _kept_draft(tmp_path / "dspark", TrainConfig(steps=300, seed=0)) == report
    assert _kept_draft(tmp_path / "dspark", TrainConfig(steps=300, seed=0, lm_head_dtype="bfloat16")) is None


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


def _written(tmp_path, name: str, config: DraftConfig, cfg: TrainConfig, cache_key: str | None) -> DraftReport:
    report = DraftReport(name, config.method, config.head, 10, 1.0, 2.0, 1.0, 1.5, 0.4, None)
    extra = {"training": asdict(report), "train_config": _jsonable(asdict(cfg))}
    if cache_key is not None:
        extra["target_cache"] = cache_key
    (tmp_path / name).mkdir()
    (tmp_path / name / "draft_config.json").write_text(replace(config, extra=extra).to_json())
    return report


def _config(method: str, **changes) -> DraftConfig:
    head = "markov" if method == "dspark" else "none"
    fields = dict(method=method, vocab_size=64, hidden_size=8, intermediate_size=16, num_layers=1,
                  num_attention_heads=2, num_kv_heads=1, head_dim=4, target_hidden_size=8, target_layer_ids=(0, 1),
                  mask_token_id=3, head=head, markov_rank=32, confidence_head=method == "dspark", draft_vocab_size=32)
    return DraftConfig(**{**fields, **changes})


def test_a_draft_of_another_shape_or_from_other_caches_is_trained_again(tmp_path):
    cfg = TrainConfig(steps=300, seed=0)
    report = _written(tmp_path, "dspark", _config("dspark"), cfg, "key1")
    same = dict(architecture=_config("dspark"), cache_key="key1")
    assert _kept_draft(tmp_path / "dspark", cfg, 32, **same) == report
    # the preset's Markov rank or depth changed: the written draft is not the one the build would train now
    assert _kept_draft(tmp_path / "dspark", cfg, 32, architecture=_config("dspark", markov_rank=64), cache_key="key1") is None
    assert _kept_draft(tmp_path / "dspark", cfg, 32, architecture=_config("dspark", num_layers=2), cache_key="key1") is None
    assert _kept_draft(tmp_path / "dspark", cfg, 32, architecture=_config("dspark", markov_w1_rows="draft"),
                       cache_key="key1") is None
    # the caches were rebuilt under another key (other prompts, another target dtype …)
    assert _kept_draft(tmp_path / "dspark", cfg, 32, architecture=_config("dspark"), cache_key="key2") is None


def test_a_draft_without_a_markov_head_is_kept_whatever_rank_the_preset_names(tmp_path):
    cfg = TrainConfig(steps=300, seed=0)
    report = _written(tmp_path, "dflash", _config("dflash"), cfg, "key1")
    assert _kept_draft(tmp_path / "dflash", cfg, 32, architecture=_config("dflash", markov_rank=64), cache_key="key1") == report


def test_a_draft_written_before_caches_were_recorded_is_trained_again(tmp_path):
    cfg = TrainConfig(steps=300, seed=0)
    _written(tmp_path, "dspark", _config("dspark"), cfg, None)
    assert _kept_draft(tmp_path / "dspark", cfg, 32, architecture=_config("dspark"), cache_key="key1") is None


def test_a_config_field_added_since_a_draft_was_written_reads_as_its_default(tmp_path):
    """A draft written before `markov_w1_rows` existed has no such key: it is the default's shape, and kept."""
    cfg = TrainConfig(steps=300, seed=0)
    report = _written(tmp_path, "dspark", _config("dspark"), cfg, "key1")
    path = tmp_path / "dspark" / "draft_config.json"
    written = json.loads(path.read_text())
    del written["markov_w1_rows"]
    path.write_text(json.dumps(written))
    assert _kept_draft(tmp_path / "dspark", cfg, 32, architecture=_config("dspark"), cache_key="key1") == report
    written["no_such_field"] = 1  # written by a newer version: not a shape this one can vouch for
    path.write_text(json.dumps(written))
    assert _kept_draft(tmp_path / "dspark", cfg, 32, architecture=_config("dspark"), cache_key="key1") is None
