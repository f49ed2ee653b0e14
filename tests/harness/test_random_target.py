"""`random:<shape>` targets: production shapes with random weights, built from the config (nothing
downloaded), marked in every row they touch, and run end to end with synthetic acceptance."""

from __future__ import annotations

import json
import tempfile

import pytest
import torch

from harness.cli import main
from harness.store import read_only_query

# The published models' exact parameter counts: the shapes are the real ones.
PUBLISHED = {"qwen3-8b": 8_190_735_360, "llama-3.1-8b": 8_030_261_248, "qwen3-0.6b": 596_049_920}


@pytest.mark.parametrize("shape", sorted(PUBLISHED))
def test_production_shapes_have_the_published_parameter_counts(shape):
    from transformers import AutoConfig, AutoModelForCausalLM

    from dspark_core.random_init import write_random_dir

    config = AutoConfig.from_pretrained(write_random_dir(tempfile.mkdtemp(), shape))
    with torch.device("meta"):  # sizes only, no memory
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[shape]


def test_a_random_ref_is_a_seeded_model_from_a_cached_directory(tmp_path, monkeypatch):
    from dspark_core.random_init import load_causal_lm, random_init
    from inputs import model_refs

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    ref = model_refs.resolve("random:tiny-llama")
    assert ref.is_local and ref.path.parent == tmp_path / "random" and random_init(ref.location)["shape"] == "tiny-llama"
    assert not any(ref.path.glob("*.safetensors"))  # no weights on disk
    first, second = (load_causal_lm(ref.location, torch.float32) for _ in range(2))
    assert type(first).__name__ == "LlamaForCausalLM"
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert model_refs.fingerprint(ref) == model_refs.fingerprint(model_refs.resolve("random:tiny-llama"))
    with pytest.raises(ValueError, match="unknown shape; valid: random:qwen3-8b"):
        model_refs.resolve("random:gpt-5")


SUITE = """\
version: 1
name: random-shapes
targets:
  rnd: {path: "random:tiny-qwen3"}
drafters:
  none: {method: none}
  self: {method: draft_model, checkpoint: "random:tiny-qwen3", synthetic_acceptance: [0.8, 0.5]}
tasks:
  gsm8k: {n_samples: 4, max_new_tokens: 16, temperature: 0}
defaults: {backend: inhouse, warmup: 0, repeats: 1}
backend_options:
  inhouse: {num_threads: 1}
matrix:
  target: [rnd]
  drafter: [none, self]
  num_drafts: [2]
  task: [gsm8k]
  concurrency: [2]
"""


def test_a_random_target_runs_with_synthetic_acceptance_and_every_row_says_so(tmp_path, data_env, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    suite, db = tmp_path / "r.yaml", tmp_path / "h.duckdb"
    suite.write_text(SUITE)
    assert main(["run", str(suite), "--db", str(db)]) == 0
    _, cells = read_only_query(db, "select drafter, label, params, provenance from cells order by drafter, repeat")
    assert len(cells) == 3  # plain, the synthetic cell, the closing plain pass
    for _drafter, label, params, provenance in cells:
        assert "RANDOM-WEIGHTS" in label and json.loads(params)["target"]["path"] == "random:tiny-qwen3"
        assert json.loads(provenance)["random_weights"] == "random:tiny-qwen3"
    assert "SYNTHETIC α=0.8,0.5" in cells[2][1]
    _, tau = read_only_query(db, "select acceptance_length from v_acceptance a join cells c using (run_id, cell_id, "
                                 "repeat) where c.drafter = 'self'")
    assert 1.6 < tau[0][0] < 2.8  # the law's 1 + 0.8 + 0.8·0.5 = 2.2, over some 25 drafting steps
