import json
import os
import stat
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_core.checkpoint import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    deepspec_draft_config,
    load_deepspec_draft,
    load_draft,
    save_draft,
)
from dspark_core.drafters import DraftStep, DSparkModel, as_drafter, build_draft_model, draft_config_for
from dspark_core.target import TargetModel

MASK = 95
LAYER_IDS = (0, 2)  # the tiny target has 4 layers: ids -1 … 2 are valid features


def _config(target, method, head="markov"):
    rank = {"markov_rank": 8} if method == "dspark" else {}  # meaningless without a head: keep the default
    return draft_config_for(
        target, method, mask_token_id=MASK, head=head, num_layers=2, target_layer_ids=LAYER_IDS, **rank
    )


def _model(config, seed=0):
    """A draft whose every tensor is random, so outputs depend on all of them (W2 starts at zero)."""
    torch.manual_seed(seed)
    model = build_draft_model(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.2 * torch.randn_like(p))
    return model.eval()


def _propose(model, seed=0, num_ctx=5, num_drafts=4):
    """Observe random context features, then draft for two rows (one sampled, one greedy)."""
    drafter = as_drafter(model)
    c = model.config
    gen = torch.Generator().manual_seed(seed)
    num_rows, capacity = 2, 16
    rows = torch.arange(num_rows)
    token_ids = torch.randint(0, c.vocab_size - 1, (num_rows, capacity), generator=gen)
    features = torch.randn(num_rows, num_ctx, c.num_target_features * c.target_hidden_size, generator=gen)
    state = drafter.start(num_rows, capacity)
    drafter.observe(state, rows, token_ids[:, :num_ctx], features, torch.full((num_rows,), num_ctx))
    step = DraftStep(
        rows=rows, token_ids=token_ids, num_tokens=torch.full((num_rows,), num_ctx + 1), num_drafts=num_drafts,
        temperatures=torch.tensor([1.0, 0.0]),
        generators=[torch.Generator().manual_seed(seed + 100 + r) for r in range(num_rows)],
    )
    return drafter.propose(state, step)


def _assert_same_proposals(a, b):
    pa, pb = _propose(a), _propose(b)
    assert torch.equal(pa.token_ids, pb.token_ids)
    assert torch.equal(pa.draft_probs, pb.draft_probs)
    if pa.confidence_logits is None:
        assert pb.confidence_logits is None
    else:
        assert torch.equal(pa.confidence_logits, pb.confidence_logits)


def _assert_same_tensors(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


CASES = [("dspark", "markov"), ("dspark", "gated"), ("dspark", "rnn"), ("dflash", "none"), ("eagle3", "none")]


# --- our format --------------------------------------------------------------------------------------


@pytest.mark.parametrize("method,head", CASES)
def test_round_trip_same_tensors_and_proposals(qwen3_target, tmp_path, method, head):
    model = _model(_config(qwen3_target, method, head))
    save_draft(model, tmp_path, extra={"sts_temperatures": [1.0, 1.25], "trained_steps": 10})
    loaded = load_draft(tmp_path)
    assert type(loaded) is type(model)
    assert loaded.config == model.config
    assert loaded.config.extra == {"sts_temperatures": [1.0, 1.25], "trained_steps": 10}
    assert not loaded.training and not loaded.embed_tokens.weight.requires_grad
    _assert_same_tensors(model, loaded)
    _assert_same_proposals(model, loaded)


def test_round_trip_same_backbone_output(qwen3_target, tmp_path):
    model = _model(_config(qwen3_target, "dspark", "rnn"))
    save_draft(model, tmp_path)
    loaded = load_draft(tmp_path)
    features = torch.randn(1, 4, 2 * 32, generator=torch.Generator().manual_seed(1))  # [batch, ctx, n·H]
    block_ids = torch.tensor([[3, MASK, MASK]])
    positions, ctx_positions = torch.arange(4, 7)[None], torch.arange(4)[None]
    attn_mask = torch.ones(1, 3, 7, dtype=torch.bool)
    h = [
        m.backbone(block_ids, positions, m.context_kv(m.fuse(features), ctx_positions), attn_mask)
        for m in (model, loaded)
    ]
    assert torch.equal(h[0], h[1])
    prev = torch.tensor([[3, 7, 9]])
    for a, b in zip(model.teacher_forced(h[0], prev), loaded.teacher_forced(h[1], prev)):
        assert torch.equal(a, b)


def test_save_is_deterministic_and_names_match_deepspec(qwen3_target, tmp_path):
    model = _model(_config(qwen3_target, "dspark", "gated"))
    save_draft(model, tmp_path / "a", extra={"note": "x"})
    save_draft(model, tmp_path / "b", extra={"note": "x"})
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    names = set(load_file(tmp_path / "a" / WEIGHTS_FILE))
    for expected in (
        "fc.weight", "hidden_norm.weight", "norm.weight", "embed_tokens.weight", "lm_head.weight",
        "layers.1.self_attn.q_proj.weight", "layers.1.self_attn.k_norm.weight", "layers.0.mlp.down_proj.weight",
        "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight",
        "markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "markov_head.gate_proj.weight",
        "markov_head.gate_proj.bias", "confidence_head.proj.weight", "confidence_head.proj.bias",
    ):
        assert expected in names


def test_saved_files_take_the_umask_not_safetensors_private_mode(qwen3_target, tmp_path):
    """safetensors writes 0600 whatever the umask; a draft saved into a shared directory must stay readable."""
    old = os.umask(0o027)
    try:
        save_draft(_model(_config(qwen3_target, "dspark", "markov")), tmp_path / "d")
    finally:
        os.umask(old)
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        assert stat.S_IMODE((tmp_path / "d" / name).stat().st_mode) == 0o640


def test_load_keeps_or_casts_dtype(qwen3_target, tmp_path):
    model = _model(_config(qwen3_target, "dspark")).to(torch.bfloat16)
    save_draft(model, tmp_path)
    assert load_draft(tmp_path).fc.weight.dtype == torch.bfloat16
    assert load_draft(tmp_path, dtype=torch.float32).markov_head.markov_w1.weight.dtype == torch.float32


def _tamper(tmp_path, edit):
    path = tmp_path / WEIGHTS_FILE
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_tensor_is_named(qwen3_target, tmp_path):
    save_draft(_model(_config(qwen3_target, "dspark")), tmp_path)
    _tamper(tmp_path, lambda t: t.pop("markov_head.markov_w1.weight"))
    with pytest.raises(ValueError, match=r"missing tensors \(1\): markov_head\.markov_w1\.weight") as err:
        load_draft(tmp_path)
    assert str(tmp_path / WEIGHTS_FILE) in str(err.value)


def test_unexpected_tensor_is_named(qwen3_target, tmp_path):
    save_draft(_model(_config(qwen3_target, "dflash")), tmp_path)
    _tamper(tmp_path, lambda t: t.update({"confidence_head.proj.weight": torch.zeros(1, 40)}))
    with pytest.raises(ValueError, match=r"unexpected tensors \(1\): confidence_head\.proj\.weight") as err:
        load_draft(tmp_path)
    assert WEIGHTS_FILE in str(err.value)


def test_shape_mismatch_names_both_shapes(qwen3_target, tmp_path):
    save_draft(_model(_config(qwen3_target, "dspark")), tmp_path)
    _tamper(tmp_path, lambda t: t.update({"fc.weight": torch.zeros(32, 96)}))
    with pytest.raises(ValueError, match=r"fc\.weight: expected \[32, 64\] vs found \[32, 96\]") as err:
        load_draft(tmp_path)
    assert WEIGHTS_FILE in str(err.value)


def test_all_problems_reported_at_once(qwen3_target, tmp_path):
    save_draft(_model(_config(qwen3_target, "eagle3")), tmp_path)

    def edit(t):
        t.pop("input_proj.weight")
        t["stray.weight"] = torch.zeros(2)
        t["norm.weight"] = torch.zeros(31)

    _tamper(tmp_path, edit)
    with pytest.raises(ValueError) as err:
        load_draft(tmp_path)
    msg = str(err.value)
    assert "input_proj.weight" in msg and "stray.weight" in msg and "norm.weight: expected [32] vs found [31]" in msg


def test_load_draft_without_config_points_to_deepspec_loader(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="load_deepspec_draft"):
        load_draft(tmp_path)


def test_extra_must_be_json(qwen3_target, tmp_path):
    with pytest.raises(ValueError, match="plain JSON"):
        save_draft(_model(_config(qwen3_target, "dflash")), tmp_path, extra={"t": torch.ones(2)})


# --- DeepSpec import -----------------------------------------------------------------------------------

DEEPSPEC_HEAD_TYPES = {"markov": "vanilla", "gated": "gated", "rnn": "rnn"}


def _deepspec_config(target, config, **overrides):
    """config.json as DeepSpec writes it: the target's Qwen3 config plus DeepSpec's fields."""
    hf = target.config.to_dict()
    hf.update(
        architectures=["Qwen3DSparkModel"], num_target_layers=hf["num_hidden_layers"],
        num_hidden_layers=config.num_layers, block_size=config.block_size, tie_word_embeddings=False,
        layer_types=["full_attention"] * config.num_layers, mask_token_id=config.mask_token_id,
        target_layer_ids=list(config.target_layer_ids), num_anchors=512,
        enable_confidence_head=config.confidence_head,
    )
    if config.head != "none":
        hf.update(markov_rank=config.markov_rank, markov_head_type=DEEPSPEC_HEAD_TYPES[config.head])
    else:
        hf.update(markov_rank=0)
    if config.confidence_head:
        hf["confidence_head_with_markov"] = True
    hf.update(overrides)
    return {k: v for k, v in hf.items() if v is not None}


def _write_deepspec(directory, hf, tensors, *, prefix="", shards=1):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf))
    tensors = {prefix + k: v.detach().clone().contiguous() for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, directory / "model.safetensors")
        return directory
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, directory / file)
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


@pytest.mark.parametrize("layout,head", [("plain", "markov"), ("model_prefix", "gated"), ("sharded", "rnn")])
def test_deepspec_checkpoint_loads_with_same_outputs(qwen3_target, tmp_path, head, layout):
    config = _config(qwen3_target, "dspark", head)
    model = _model(config)
    hf = _deepspec_config(qwen3_target, config)
    _write_deepspec(
        tmp_path, hf, model.state_dict(),
        prefix="model." if layout == "model_prefix" else "", shards=3 if layout == "sharded" else 1,
    )
    loaded = load_deepspec_draft(tmp_path)
    assert isinstance(loaded, DSparkModel)
    assert loaded.config == config  # every field maps (extra is not compared)
    assert loaded.config.head == head and loaded.config.extra["num_target_layers"] == 4
    _assert_same_tensors(model, loaded)
    _assert_same_proposals(model, loaded)


def test_deepspec_orig_mod_prefix_and_rope_theta_field(qwen3_target, tmp_path):
    config = _config(qwen3_target, "dspark")
    model = _model(config)
    hf = _deepspec_config(qwen3_target, config, rope_parameters=None, rope_theta=10000.0)
    _write_deepspec(tmp_path, hf, model.state_dict(), prefix="_orig_mod.")
    _assert_same_proposals(model, load_deepspec_draft(tmp_path))


def test_deepspec_without_embeddings_needs_the_target(qwen3_target, tmp_path):
    config = _config(qwen3_target, "dspark")
    model = _model(config)
    model.copy_target_embeddings(qwen3_target.input_embeddings(), qwen3_target.output_embeddings())
    tensors = {k: v for k, v in model.state_dict().items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    _write_deepspec(tmp_path, _deepspec_config(qwen3_target, config), tensors)
    with pytest.raises(ValueError, match=r"embed_tokens\.weight / lm_head\.weight.*pass target="):
        load_deepspec_draft(tmp_path)
    loaded = load_deepspec_draft(tmp_path, target=qwen3_target)
    assert torch.equal(loaded.lm_head.weight, qwen3_target.output_embeddings().weight)
    assert loaded.lm_head.weight.data_ptr() != qwen3_target.output_embeddings().weight.data_ptr()
    _assert_same_proposals(model, loaded)
    _assert_same_proposals(model, load_deepspec_draft(tmp_path, target=qwen3_target.model))  # a bare HF model


def test_deepspec_dflash_layout_loads_as_dflash(qwen3_target, tmp_path):
    config = _config(qwen3_target, "dflash")
    model = _model(config)
    hf = _deepspec_config(qwen3_target, config, mask_token_id=None, target_layer_ids=None, markov_rank=None)
    hf.update(architectures=["DFlashDraftModel"], dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 2]})
    _write_deepspec(tmp_path, hf, model.state_dict())
    loaded = load_deepspec_draft(tmp_path)
    assert loaded.config.method == "dflash" and loaded.markov_head is None and loaded.confidence_head is None
    assert loaded.config == config
    _assert_same_proposals(model, loaded)


def test_vllm_alternative_fields(qwen3_target):
    config = _config(qwen3_target, "dspark")
    hf = _deepspec_config(qwen3_target, config, mask_token_id=None, target_layer_ids=None)
    with_aux = dict(hf, eagle_aux_hidden_state_layer_ids=[1, 3], dspark_noise_token_id=MASK)
    assert deepspec_draft_config(with_aux).target_layer_ids == (0, 2)  # vLLM counts the embeddings as 0
    with_dspark = dict(hf, dspark_target_layer_ids=[0, 2], dflash_config={"mask_token_id": MASK})
    mapped = deepspec_draft_config(with_dspark)
    assert (mapped.target_layer_ids, mapped.mask_token_id) == ((0, 2), MASK)


def test_deepspec_missing_mask_token_is_a_clear_error(qwen3_target, tmp_path):
    config = _config(qwen3_target, "dspark")
    hf = _deepspec_config(qwen3_target, config, mask_token_id=None)
    _write_deepspec(tmp_path, hf, _model(config).state_dict())
    with pytest.raises(ValueError, match=r"config\.json.*no mask token id.*dspark_noise_token_id"):
        load_deepspec_draft(tmp_path)


def test_deepspec_confidence_head_without_markov_is_refused(qwen3_target, tmp_path):
    config = _config(qwen3_target, "dspark")
    hf = _deepspec_config(qwen3_target, config, confidence_head_with_markov=False)
    with pytest.raises(ValueError, match=r"confidence head reads h alone"):
        deepspec_draft_config(hf)
    # Field absent (vLLM's default is false): the stored head's width decides.
    hf.pop("confidence_head_with_markov")
    assert deepspec_draft_config(hf, {"confidence_head.proj.weight": (1, 32 + 8)}).confidence_head
    with pytest.raises(ValueError, match=r"confidence head reads h alone"):
        deepspec_draft_config(hf, {"confidence_head.proj.weight": (1, 32)})


def test_deepspec_strict_load_names_tensor_and_file(qwen3_target, tmp_path):
    config = _config(qwen3_target, "dspark", "gated")
    tensors = _model(config).state_dict()
    tensors.pop("markov_head.gate_proj.bias")
    tensors["markov_head.markov_w2.weight"] = torch.zeros(96, 16)
    _write_deepspec(tmp_path, _deepspec_config(qwen3_target, config), tensors, shards=2)
    with pytest.raises(ValueError) as err:
        load_deepspec_draft(tmp_path)
    msg = str(err.value)
    assert "model.safetensors.index.json" in msg and "missing tensors (1): markov_head.gate_proj.bias" in msg
    assert "markov_head.markov_w2.weight: expected [96, 8] vs found [96, 16]" in msg


def test_deepspec_head_type_mapping_and_refusals(qwen3_target):
    config = _config(qwen3_target, "dspark")
    hf = _deepspec_config(qwen3_target, config)
    assert deepspec_draft_config(dict(hf, markov_head_type="gated")).head == "gated"
    assert deepspec_draft_config(dict(hf, markov_head_type="rnn")).head == "rnn"
    assert deepspec_draft_config({k: v for k, v in hf.items() if k != "markov_head_type"}).head == "markov"
    with pytest.raises(ValueError, match="markov_head_type 'lstm'"):
        deepspec_draft_config(dict(hf, markov_head_type="lstm"))
    with pytest.raises(ValueError, match="model_type 'gemma4'"):
        deepspec_draft_config(dict(hf, model_type="gemma4"))
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        deepspec_draft_config(dict(hf, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6}))
    assert deepspec_draft_config(dict(hf, draft_vocab_size=32)).draft_vocab_size == 32
    assert deepspec_draft_config(dict(hf, draft_vocab_size=hf["vocab_size"])).draft_vocab_size is None
    with pytest.raises(ValueError, match="draft_vocab_size 32 < vocab_size 96 but no d2t"):
        deepspec_draft_config(dict(hf, draft_vocab_size=32), {"fc.weight": (32, 64)})


def test_shared_embeddings_and_bf16_storage_round_trip(qwen3_target, tmp_path):
    """A draft saved without its (frozen, target-copied) embeddings loads back only with the target."""
    model = build_draft_model(_config(qwen3_target, "dspark"))
    model.copy_target_embeddings(qwen3_target.input_embeddings(), qwen3_target.output_embeddings())
    save_draft(model, tmp_path, dtype=torch.bfloat16, share_target_embeddings=True)
    stored = load_file(str(tmp_path / WEIGHTS_FILE))
    assert "embed_tokens.weight" not in stored and "lm_head.weight" not in stored
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="embed_tokens.weight / lm_head.weight.*pass target="):
        load_draft(tmp_path)
    loaded = load_draft(tmp_path, dtype=torch.float32, target=qwen3_target)
    assert torch.equal(loaded.lm_head.weight, qwen3_target.output_embeddings().weight)
    assert torch.equal(loaded.fc.weight, model.fc.weight.to(torch.bfloat16).float())
    assert not loaded.embed_tokens.weight.requires_grad


# --- a reduced draft vocabulary -----------------------------------------------------------------------


def _subvocab_model(target, method, head="markov", size=None, seed=3):
    """A random draft over `size` (default half) of the target's tokens, a fixed random choice."""
    ids = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(seed))[: size or target.vocab_size // 2]
    model = _model(replace(_config(target, method, head), draft_vocab_size=len(ids)))
    model.set_draft_vocabulary(ids)
    return model


@pytest.mark.parametrize("method,head", [("dspark", "markov"), ("dspark", "rnn"), ("dflash", "none"), ("eagle3", "none")])
def test_reduced_vocabulary_round_trip_and_proposals(qwen3_target, tmp_path, method, head):
    model = _subvocab_model(qwen3_target, method, head)
    assert model.lm_head.weight.shape == (48, 32)
    save_draft(model, tmp_path)
    loaded = load_draft(tmp_path)
    assert loaded.config.draft_vocab_size == 48 and loaded.draft_to_target.dtype == torch.long
    _assert_same_tensors(model, loaded)
    _assert_same_proposals(model, loaded)
    proposal = _propose(loaded)
    vocab = set(model.draft_to_target.tolist())
    assert set(proposal.token_ids.flatten().tolist()) <= vocab
    assert proposal.draft_probs.shape[-1] == qwen3_target.vocab_size  # over the target's vocabulary
    outside = torch.tensor([t not in vocab for t in range(qwen3_target.vocab_size)])
    assert proposal.draft_probs[..., outside].abs().max() == 0
    assert torch.allclose(proposal.draft_probs.sum(-1), torch.ones(()), atol=1e-5)
    # the training labels' inverse map is rebuilt on load (it is not stored): every draft token back to its
    # index, every other token to −1
    everything = torch.arange(qwen3_target.vocab_size)
    expected = torch.tensor([model.draft_to_target.tolist().index(t) if t in vocab else -1 for t in everything.tolist()])
    assert torch.equal(loaded.to_draft_ids(everything), expected) and torch.equal(model.to_draft_ids(everything), expected)
    drafted = proposal.draft_probs.gather(-1, proposal.token_ids[..., None]).squeeze(-1)
    assert bool((drafted > 0).all())  # each drafted token has the probability it was drawn with


def test_reduced_vocabulary_shares_the_target_head_rows_and_keeps_its_ids_exact_in_bf16(tmp_path):
    """Ids above 256 are not representable in bf16: a save or load that cast them would move tokens."""
    from conftest import tiny_qwen3

    target = TargetModel(tiny_qwen3(vocab_size=600))
    model = _subvocab_model(target, "dspark", size=300)
    assert int(model.draft_to_target.max()) > 257
    model.copy_target_embeddings(target.input_embeddings(), target.output_embeddings())
    head_rows = target.output_embeddings().weight[model.draft_to_target]
    assert torch.equal(model.lm_head.weight, head_rows)
    save_draft(model, tmp_path, dtype=torch.bfloat16, share_target_embeddings=True)
    stored = load_file(str(tmp_path / WEIGHTS_FILE))
    assert "lm_head.weight" not in stored and stored["draft_to_target"].dtype == torch.long
    assert torch.equal(stored["draft_to_target"], model.draft_to_target)
    loaded = load_draft(tmp_path, dtype=torch.float32, target=target)
    assert torch.equal(loaded.draft_to_target, model.draft_to_target)
    assert torch.equal(loaded.lm_head.weight, head_rows)


def test_draft_vocabulary_must_be_distinct_ids_of_the_right_count(qwen3_target):
    model = _subvocab_model(qwen3_target, "dspark")
    with pytest.raises(ValueError, match="48 distinct target ids in \\[0, 96\\).*got 47 distinct"):
        model.set_draft_vocabulary(torch.cat([torch.arange(47), torch.tensor([0])]))
    with pytest.raises(ValueError, match="got 48 distinct"):
        model.set_draft_vocabulary(torch.arange(50, 98))  # 96, 97 are outside the vocabulary
    with pytest.raises(ValueError, match="full vocabulary"):
        _model(_config(qwen3_target, "dspark")).set_draft_vocabulary(torch.arange(48))
    with pytest.raises(ValueError, match="draft_vocab_size must lie in \\[1, vocab_size = 96\\]"):
        replace(_config(qwen3_target, "dspark"), draft_vocab_size=97)


def test_deepspec_reduced_vocabulary_reads_vllm_d2t_offsets(qwen3_target, tmp_path):
    model = _subvocab_model(qwen3_target, "dspark")
    ids = model.draft_to_target
    hf = _deepspec_config(qwen3_target, model.config, draft_vocab_size=48)
    tensors = {k: v for k, v in model.state_dict().items() if k != "draft_to_target"}
    tensors["d2t"] = ids - torch.arange(48)  # vLLM: target id = draft index + d2t[index]
    _write_deepspec(tmp_path / "ok", hf, tensors)
    loaded = load_deepspec_draft(tmp_path / "ok")
    assert loaded.config.draft_vocab_size == 48
    _assert_same_tensors(model, loaded)
    _assert_same_proposals(model, loaded)
    del tensors["d2t"]
    _write_deepspec(tmp_path / "no-d2t", hf, tensors)
    with pytest.raises(ValueError, match="no d2t tensor"):
        load_deepspec_draft(tmp_path / "no-d2t")
