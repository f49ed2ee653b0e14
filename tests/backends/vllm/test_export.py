"""Export to vLLM's layout, then load_deepspec_draft: the same draft (same greedy proposals); refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_core.checkpoint import load_deepspec_draft, load_draft, save_draft
from dspark_core.drafters import DraftStep, as_drafter, build_draft_model, draft_config_for
from backends.vllm.export import ExportError, check_vllm_checkpoint, export_vllm, main, vllm_tensor_shapes

REPO = Path(__file__).resolve().parents[3]
EMBEDDED = REPO / "models" / "embedded"
MASK = 95


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, qwen3_target):
    """conftest's tiny Qwen3 target saved as a Hugging Face directory (what --target points at)."""
    path = tmp_path_factory.mktemp("target")
    qwen3_target.model.save_pretrained(path)
    return path


def _draft(target, method, head="markov", seed=0, draft_vocabulary=None, **kw):
    config = draft_config_for(target, method, mask_token_id=MASK, head=head, num_layers=2, target_layer_ids=(0, 2),
                              markov_rank=8, draft_vocab_size=None if draft_vocabulary is None else len(draft_vocabulary),
                              **kw)
    torch.manual_seed(seed)
    model = build_draft_model(config)
    if draft_vocabulary is not None:
        model.set_draft_vocabulary(draft_vocabulary)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in ("embed_tokens.weight", "lm_head.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.2 * torch.randn_like(p))
    model.copy_target_embeddings(target.input_embeddings(), target.output_embeddings())
    return model.eval()


@pytest.fixture(scope="module")
def target(target_dir):
    from dspark_core.target import TargetModel

    return TargetModel.from_pretrained(str(target_dir), dtype=torch.float32)


def _proposals(model, seed=0, num_ctx=6, num_drafts=5, temperature=0.0):
    """Drafts for three rows of random context features and tokens (greedy by default: tokens, no probs)."""
    drafter = as_drafter(model)
    c = model.config
    gen = torch.Generator().manual_seed(seed)
    rows = torch.arange(3)
    token_ids = torch.randint(0, c.vocab_size - 1, (3, 16), generator=gen)
    features = torch.randn(3, num_ctx, c.num_target_features * c.target_hidden_size, generator=gen)
    state = drafter.start(3, 16)
    drafter.observe(state, rows, token_ids[:, :num_ctx], features, torch.full((3,), num_ctx))
    step = DraftStep(rows=rows, token_ids=token_ids, num_tokens=torch.full((3,), num_ctx + 1), num_drafts=num_drafts,
                     temperatures=torch.full((3,), temperature), generators=[torch.Generator().manual_seed(r) for r in range(3)])
    return drafter.propose(state, step)


@pytest.mark.parametrize("method,confidence", [("dspark", True), ("dspark", False), ("dflash", False)])
def test_round_trip_same_proposals(target, target_dir, tmp_path, method, confidence):
    model = _draft(target, method, **({"confidence_head": confidence} if method == "dspark" else {}))
    save_draft(model, tmp_path / "ours")
    report = export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)
    assert report.architecture == "Qwen3DSparkModel" and report.vllm_method == "dspark"
    assert report.shared_with_target == ("embed_tokens.weight", "lm_head.weight")
    hf = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert hf["target_layer_ids"] == [0, 2] and hf["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [0, 2]}
    assert hf["enable_confidence_head"] is confidence and hf["confidence_head_with_markov"] is True
    assert hf["sample_from_anchor"] is True and hf["num_hidden_layers"] == 2 and hf["num_target_layers"] == 4
    names = set(load_file(tmp_path / "vllm" / "model.safetensors"))
    assert not any(n.startswith("model.") for n in names) and "embed_tokens.weight" not in names
    loaded = load_deepspec_draft(tmp_path / "vllm", target=target)
    a, b = _proposals(model), _proposals(loaded)
    assert torch.equal(a.token_ids, b.token_ids)
    if confidence:
        assert torch.allclose(a.confidence_logits, b.confidence_logits)
    a, b = _proposals(model, temperature=1.0), _proposals(loaded, temperature=1.0)  # sampled: the whole law
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.equal(a.draft_probs, b.draft_probs)


@pytest.mark.parametrize("method", ["dspark", "dflash"])
def test_reduced_vocabulary_exports_its_head_rows_and_d2t_offsets(target, target_dir, tmp_path, method):
    """vLLM refuses a reduced vocabulary without its own lm_head and d2t (target id = index + d2t[index])."""
    vocab = torch.randperm(96, generator=torch.Generator().manual_seed(4))[:40].sort().values
    model = _draft(target, method, draft_vocabulary=vocab)
    save_draft(model, tmp_path / "ours", share_target_embeddings=True)
    report = export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)
    assert report.shared_with_target == ("embed_tokens.weight",)
    hf = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert hf["draft_vocab_size"] == 40 and hf["vocab_size"] == 96
    stored = load_file(tmp_path / "vllm" / "model.safetensors")
    assert "draft_to_target" not in stored and stored["d2t"].dtype == torch.long
    assert torch.equal(stored["d2t"] + torch.arange(40), vocab)
    assert torch.equal(stored["lm_head.weight"], target.output_embeddings().weight[vocab])
    assert stored["markov_head.markov_w2.weight"].shape[0] == 40
    assert vllm_tensor_shapes(hf)["d2t"] == (40,)
    loaded = load_deepspec_draft(tmp_path / "vllm", target=target)
    assert torch.equal(loaded.draft_to_target, vocab)
    a, b = _proposals(model, temperature=1.0), _proposals(loaded, temperature=1.0)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.draft_probs, b.draft_probs)
    del stored["d2t"]
    save_file(stored, tmp_path / "vllm" / "model.safetensors")
    with pytest.raises(ValueError, match="missing tensors \\(1\\): d2t"):
        check_vllm_checkpoint(tmp_path / "vllm")


def test_w1_over_the_draft_vocabulary_exports_as_target_rows(target, target_dir, tmp_path):
    """A draft whose Markov W1 has a row per draft token and one shared row (`markov_w1_rows` "draft") is written
    with vLLM's W1 over every target id; loaded back from that layout it drafts exactly as it did, anchors
    outside the draft vocabulary (the shared row) included."""
    vocab = torch.randperm(96, generator=torch.Generator().manual_seed(4))[:40].sort().values
    model = _draft(target, "dspark", draft_vocabulary=vocab, markov_w1_rows="draft")
    assert model.markov_head.markov_w1.weight.shape == (41, 8)
    save_draft(model, tmp_path / "ours", share_target_embeddings=True)
    reloaded = load_draft(tmp_path / "ours", target=target)
    assert reloaded.config.markov_w1_rows == "draft"
    export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)
    stored = load_file(tmp_path / "vllm" / "model.safetensors")
    assert stored["markov_head.markov_w1.weight"].shape == (96, 8)
    loaded = load_deepspec_draft(tmp_path / "vllm", target=target)
    assert loaded.config.markov_w1_rows == "target"
    anchors = torch.randint(0, 95, (3, 16), generator=torch.Generator().manual_seed(0))[:, 6]  # `_proposals`' anchors
    assert not torch.isin(anchors, vocab).all()  # the shared row is read
    for temperature in (0.0, 1.0):
        a, b, c = (_proposals(m, temperature=temperature) for m in (model, reloaded, loaded))
        assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.token_ids, c.token_ids)
        torch.testing.assert_close(a.confidence_logits, c.confidence_logits)
        if temperature:
            assert torch.equal(a.draft_probs, c.draft_probs)


def test_dflash_exports_as_a_zero_markov_head(target, target_dir, tmp_path):
    save_draft(_draft(target, "dflash"), tmp_path / "ours")
    report = export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)
    tensors = load_file(tmp_path / "vllm" / "model.safetensors")
    assert not tensors["markov_head.markov_w1.weight"].any() and not tensors["markov_head.markov_w2.weight"].any()
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["markov_rank"] == 1
    assert any("zero Markov head" in n for n in report.notes)


def test_dflash_fill_in_layout_is_opt_in(target, target_dir, tmp_path):
    save_draft(_draft(target, "dflash"), tmp_path / "ours")
    with pytest.raises(ExportError, match="shifted by one"):
        export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir, layout="dflash")
    report = export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir, layout="dflash", allow_fill_in=True)
    hf = check_vllm_checkpoint(tmp_path / "vllm")
    assert report.vllm_method == "dflash" and hf["architectures"] == ["DFlashDraftModel"] and "markov_rank" not in hf
    assert set(vllm_tensor_shapes(hf)) == set(load_file(tmp_path / "vllm" / "model.safetensors"))


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_heads_vllm_lacks_are_refused(target, target_dir, tmp_path, head):
    save_draft(_draft(target, "dspark", head=head), tmp_path / "ours")
    with pytest.raises(ExportError, match=f"'{head}' head has no vLLM counterpart"):
        export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)
    assert not (tmp_path / "vllm").exists()


def test_eagle3_is_refused(target, target_dir, tmp_path):
    save_draft(_draft(target, "eagle3"), tmp_path / "ours")
    with pytest.raises(ExportError, match="Eagle3"):
        export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)


def test_missing_tensor_is_refused_and_named(target, target_dir, tmp_path):
    """vLLM would load a checkpoint without markov_w1 silently with garbage: the exporter must not."""
    save_draft(_draft(target, "dspark"), tmp_path / "ours")
    weights = tmp_path / "ours" / "model.safetensors"
    tensors = load_file(weights)
    del tensors["markov_head.markov_w1.weight"], tensors["confidence_head.proj.bias"]
    save_file(tensors, weights)
    with pytest.raises(ExportError, match="(?s)missing tensors \\(2\\): confidence_head.proj.bias, markov_head.markov_w1.weight"):
        export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)
    assert not (tmp_path / "vllm").exists()


def test_check_vllm_checkpoint_names_what_is_missing(target, target_dir, tmp_path):
    save_draft(_draft(target, "dspark"), tmp_path / "ours")
    export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)
    weights = tmp_path / "vllm" / "model.safetensors"
    tensors = load_file(weights)
    tensors.pop("layers.1.mlp.up_proj.weight")
    tensors["markov_head.extra.weight"] = torch.zeros(1)
    save_file(tensors, weights)
    with pytest.raises(ValueError, match="(?s)missing tensors \\(1\\): layers.1.mlp.up_proj.weight.*unexpected tensors \\(1\\): markov_head.extra.weight"):
        check_vllm_checkpoint(tmp_path / "vllm")


def test_embeddings_that_differ_from_the_target_are_written(target, target_dir, tmp_path):
    model = _draft(target, "dspark")
    with torch.no_grad():
        model.lm_head.weight.add_(0.5)
    save_draft(model, tmp_path / "ours")
    report = export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)
    assert report.shared_with_target == ("embed_tokens.weight",)
    assert "lm_head.weight" in load_file(tmp_path / "vllm" / "model.safetensors")
    loaded = load_deepspec_draft(tmp_path / "vllm", target=target)
    assert torch.equal(_proposals(model).token_ids, _proposals(loaded).token_ids)
    export_vllm(tmp_path / "ours", tmp_path / "all", target_dir=target_dir, include_embeddings=True)
    assert {"embed_tokens.weight", "lm_head.weight"} <= set(load_file(tmp_path / "all" / "model.safetensors"))


def test_target_mismatch_and_overwrite(target, target_dir, tmp_path):
    save_draft(_draft(target, "dspark"), tmp_path / "ours")
    other = tmp_path / "other_target"
    other.mkdir()
    hf = json.loads((target_dir / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(hf | {"vocab_size": 128}))
    with pytest.raises(ExportError, match="vocab_size 128 != draft vocab_size 96"):
        export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=other)
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "note.txt").write_text("x")
    with pytest.raises(ExportError, match="not empty"):
        export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir)
    export_vllm(tmp_path / "ours", tmp_path / "vllm", target_dir=target_dir, overwrite=True)
    assert not (tmp_path / "vllm" / "note.txt").exists()


@pytest.mark.parametrize("name", ["dspark", "dflash"])
def test_embedded_drafts_round_trip_on_real_prompts(tmp_path, name):
    """The committed drafts on the committed target: greedy generation with the exported-and-reloaded draft
    gives the same outputs and the same per-step acceptance as the original."""
    from dspark_core.generate import GenerationConfig, generate
    from dspark_core.target import TargetModel

    target = TargetModel.from_pretrained(str(EMBEDDED / "target"), dtype=torch.float32)
    assert main([str(EMBEDDED / "drafts" / name), str(tmp_path / "vllm"), "--target", str(EMBEDDED / "target")]) == 0
    original = load_draft(EMBEDDED / "drafts" / name, target=target, dtype=torch.float32)
    exported = load_deepspec_draft(tmp_path / "vllm", target=target, dtype=torch.float32)
    prompts = [[1, 2428, 202, 48, 1473, 311, 270], [1, 2428, 202, 2877, 309, 1963], [1, 17, 342, 477, 650]]
    config = GenerationConfig(max_new_tokens=24, num_drafts=5, temperature=0.0)
    results = []
    for model in (original, exported):
        drafter = as_drafter(model)
        target.set_layer_ids(drafter.target_layer_ids)
        results.append(generate(target, drafter, prompts, config))
    for a, b in zip(*results):
        assert a.output_ids == b.output_ids
        assert a.counters.num_accepted == b.counters.num_accepted


def test_cli_refusal_exits_2(tmp_path, capsys):
    assert main([str(EMBEDDED / "drafts" / "dspark-rnn"), str(tmp_path / "x"), "--target", str(EMBEDDED / "target")]) == 2
    assert "no vLLM counterpart" in capsys.readouterr().err
