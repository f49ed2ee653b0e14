"""Draft checkpoints on disk: our own format, and import of released DeepSpec / vLLM DSpark checkpoints.

Our format is a directory with two files:

- `model.safetensors`: every tensor of the module's `state_dict`, under its own name, no prefix. The
  names already are DeepSpec's and vLLM's (`fc.weight`, `layers.0.self_attn.q_proj.weight`,
  `markov_head.markov_w1.weight`, `confidence_head.proj.weight`, …), so a DSpark draft saved here can
  be served by vLLM after writing a `config.json` beside it.
- `draft_config.json`: `DraftConfig.to_json()`; its `extra` carries STS temperatures, provenance, ….

A draft with a reduced vocabulary also stores `draft_to_target` (int64, the target ids of its LM head rows;
vLLM's `d2t` holds the same as offsets, `target id − index`). Integer tensors keep their dtype whatever
`dtype` a save or load asks for.

Same weights and config give the same bytes. Loading is strict: a missing, unexpected or misshapen
tensor is an error that lists every such name (and both shapes) and names the file.

A DeepSpec checkpoint (`Qwen3DSparkModel`, also a DFlash draft in the same layout) is an HF-style
directory: `config.json` (the target's Qwen3 config with DeepSpec's fields) and `model.safetensors`,
possibly sharded with `model.safetensors.index.json`. `load_deepspec_draft` maps it onto a
`DraftConfig` and loads it with the same strict check. Target layer ids everywhere here mean "the
residual stream after target layer i" (-1: embeddings), as in DeepSpec; vLLM's
`eagle_aux_hidden_state_layer_ids` count one higher (0 = embeddings), so 1 is subtracted from them.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.dspark import DSparkModel
from dspark_core.drafters.eagle3 import Eagle3Model
from dspark_core.drafters.models import build_draft_model

WEIGHTS_FILE = "model.safetensors"
SHARED_WITH_TARGET = ("embed_tokens.weight", "lm_head.weight")  # frozen copies of the target's
DRAFT_VOCAB_TENSOR = "draft_to_target"  # a reduced draft vocabulary's target ids (TargetFedDraft)
CONFIG_FILE = "draft_config.json"
HF_CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"

# DeepSpec's `markov_head_type` → our `DraftConfig.head`.
DEEPSPEC_HEADS = {"vanilla": "markov", "markov": "markov", "gated": "gated", "rnn": "rnn"}
# Names some exporters add that no draft here reads: vLLM skips them too.
IGNORED_TENSORS = ("t2d", "mask_embedding")
_PREFIXES = ("_orig_mod.", "module.", "model.")
_MODEL_TYPES = ("qwen3", "dflash", "dspark", "qwen3_dspark")


# ---------------------------------------------------------------------------------------------------
# Our format


def save_draft(
    model: DSparkModel | Eagle3Model,
    directory: str | Path,
    *,
    extra: dict | None = None,
    dtype: torch.dtype | None = None,
    share_target_embeddings: bool = False,
) -> Path:
    """Write `model.safetensors` and `draft_config.json` into `directory` (created); returns it.

    Tensors keep the model's dtype unless `dtype` is given. `share_target_embeddings` leaves out
    `embed_tokens`/`lm_head` (frozen copies of the target's, often most of a small draft's bytes);
    loading then needs `target=`, as vLLM shares them from the target when absent. `extra` is merged
    over `model.config.extra` (it must be plain JSON).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config
    if extra:
        config = replace(config, extra={**config.extra, **extra})
    try:
        config_text = config.to_json() + "\n"
    except TypeError as err:
        raise ValueError(f"draft config extra must be plain JSON (str, number, bool, list, dict): {err}") from None
    tensors = {
        name: t.detach().to("cpu", dtype=_float_dtype(t, dtype)).contiguous()
        for name, t in model.state_dict().items()
        if not (share_target_embeddings and name in SHARED_WITH_TARGET)
    }
    _write_atomic(directory / WEIGHTS_FILE, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    _write_atomic(directory / CONFIG_FILE, lambda tmp: tmp.write_text(config_text))
    return directory


def load_draft(
    directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, *, target: Any = None
) -> DSparkModel | Eagle3Model:
    """Rebuild a draft written by `save_draft`. `dtype=None` keeps the stored dtype of `fc.weight`.

    A draft saved with `share_target_embeddings` needs `target` (a `TargetModel` or Hugging Face causal LM).
    """
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        hint = (
            f"; it has a {HF_CONFIG_FILE}: for a DeepSpec/vLLM checkpoint use load_deepspec_draft"
            if (directory / HF_CONFIG_FILE).is_file()
            else ""
        )
        raise FileNotFoundError(f"no {CONFIG_FILE} in {directory}{hint}")
    config = DraftConfig.load(config_path)
    tensors, source = read_safetensors(directory)
    tensors, source = _fill_shared_embeddings(tensors, source, target)
    return _build_and_load(config, tensors, source, device, dtype)


# ---------------------------------------------------------------------------------------------------
# DeepSpec / vLLM import


def deepspec_draft_config(
    hf: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]] | None = None
) -> DraftConfig:
    """Map a DeepSpec/vLLM `Qwen3DSparkModel` (or DFlash) `config.json` onto a `DraftConfig`.

    `markov_rank` > 0 gives method "dspark" (`markov_head_type` vanilla → markov, gated, rnn; vanilla when
    absent), otherwise "dflash". Our confidence head reads [h ; W1[x_{k−1}]], so a checkpoint whose head
    reads h alone (`confidence_head_with_markov: false`) is refused. When that field is absent, the
    width of `confidence_head.proj.weight` in `tensor_shapes` decides.
    """
    def refuse(why: str) -> ValueError:
        return ValueError(f"unsupported DeepSpec draft config: {why}")

    model_type = hf.get("model_type")
    if model_type is not None and model_type not in _MODEL_TYPES:
        raise refuse(f"model_type {model_type!r}: only Qwen3-shaped drafts ({', '.join(_MODEL_TYPES)}) map onto ours")
    hidden = _required(hf, "hidden_size")
    num_heads = _required(hf, "num_attention_heads")
    rank = int(hf.get("markov_rank") or 0)
    head = "none"
    if rank > 0:
        head_type = str(hf.get("markov_head_type") or "vanilla").lower()
        if head_type not in DEEPSPEC_HEADS:
            raise refuse(f"markov_head_type {head_type!r}; valid: {', '.join(DEEPSPEC_HEADS)}")
        head = DEEPSPEC_HEADS[head_type]
    confidence = bool(hf.get("enable_confidence_head", False))
    if confidence:
        with_markov = hf.get("confidence_head_with_markov")
        width = (tensor_shapes or {}).get("confidence_head.proj.weight")
        if with_markov is None and width is not None:
            with_markov = width[-1] == hidden + rank
        if not with_markov or rank == 0:
            raise refuse(
                "the confidence head reads h alone (confidence_head_with_markov false, or no Markov head); "
                "ours reads [h ; W1[x_{k-1}]]"
            )
    if hf.get("sample_from_anchor") is False:
        raise refuse("sample_from_anchor false: our block is the anchor then mask tokens, every slot predicting")
    if hf.get("use_aux_hidden_state") is False:
        raise refuse("use_aux_hidden_state false: our drafts always read the target's hidden states")
    vocab = _required(hf, "vocab_size")
    draft_vocab: int | None = int(hf["draft_vocab_size"]) if hf.get("draft_vocab_size") is not None else None
    if draft_vocab == int(vocab):
        draft_vocab = None  # the whole vocabulary, stated
    if draft_vocab is not None and tensor_shapes is not None and "d2t" not in tensor_shapes:
        raise refuse(f"draft_vocab_size {draft_vocab} < vocab_size {vocab} but no d2t tensor maps its tokens")
    if hf.get("attention_bias"):
        raise refuse("attention_bias true: our draft attention has no biases")
    if hf.get("hidden_act", "silu") != "silu":
        raise refuse(f"hidden_act {hf['hidden_act']!r}: our MLP is SiLU-gated")
    layer_types = set(hf.get("layer_types") or []) - {"full_attention"}
    if layer_types:
        raise refuse(f"layer_types {sorted(layer_types)}: only full attention is supported")
    extra: dict[str, Any] = {"imported_from": "deepspec"}
    if hf.get("num_target_layers") is not None:
        extra["num_target_layers"] = int(hf["num_target_layers"])
    return DraftConfig(
        method="dspark" if rank > 0 else "dflash",
        vocab_size=int(vocab),
        hidden_size=int(hidden),
        intermediate_size=int(_required(hf, "intermediate_size")),
        num_layers=int(_required(hf, "num_hidden_layers")),
        num_attention_heads=int(num_heads),
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hidden // num_heads),
        target_hidden_size=int(hf.get("target_hidden_size") or hidden),
        target_layer_ids=_target_layer_ids(hf),
        mask_token_id=_mask_token_id(hf),
        block_size=int(hf.get("block_size") or 7),
        head=head,
        markov_rank=rank if rank > 0 else DraftConfig.markov_rank,
        confidence_head=confidence,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(hf),
        draft_vocab_size=draft_vocab,
        extra=extra,
    )


def load_deepspec_draft(
    directory: str | Path,
    device: str | torch.device = "cpu",
    *,
    target: Any = None,
    dtype: torch.dtype | None = None,
) -> DSparkModel:
    """Load a released DeepSpec DSpark (or DFlash) checkpoint directory as our `DSparkModel`.

    Key prefixes `model.`, `_orig_mod.`, `module.` are stripped; `t2d`/`mask_embedding` are skipped. A reduced
    draft vocabulary (`draft_vocab_size` < `vocab_size`) comes with vLLM's `d2t` offsets (target id − draft index),
    read as the model's `draft_to_target`; a `d2t` beside the whole vocabulary (the identity) is dropped.
    Checkpoints without `embed_tokens`/`lm_head` share the target's: pass `target` (a `TargetModel`
    or a Hugging Face causal LM) and its weights are copied in; tensors the checkpoint has are kept.
    `dtype=None` keeps the stored dtype of `fc.weight` (the confidence head, often fp32, follows it).
    """
    directory = Path(directory)
    config_path = directory / HF_CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"no {HF_CONFIG_FILE} in {directory}: not a Hugging Face style DeepSpec checkpoint")
    hf = json.loads(config_path.read_text())
    tensors, source = read_safetensors(directory)
    tensors = _normalise_names(tensors, source)
    try:
        config = deepspec_draft_config(hf, {k: tuple(v.shape) for k, v in tensors.items()})
    except ValueError as err:
        raise ValueError(f"{config_path}: {err}") from None
    offsets = tensors.pop("d2t", None)
    if offsets is not None and config.draft_vocab_size is not None:  # vLLM's d2t: target id − draft index
        tensors[DRAFT_VOCAB_TENSOR] = torch.arange(len(offsets), dtype=torch.long) + offsets.long()
    elif offsets is not None and bool(offsets.ne(0).any()):
        raise ValueError(f"{source}: d2t reorders the whole vocabulary (draft_vocab_size = vocab_size); "
                         "only the identity or a reduced vocabulary is supported")
    tensors, source = _fill_shared_embeddings(tensors, source, target)
    model = _build_and_load(config, tensors, source, device, dtype)
    assert isinstance(model, DSparkModel)  # a DeepSpec config is dspark or dflash (deepspec_draft_config)
    return model


# ---------------------------------------------------------------------------------------------------
# Reading tensors and checking them


def read_safetensors(directory: str | Path) -> tuple[dict[str, Tensor], str]:
    """All tensors of `model.safetensors`, or of the shards that `model.safetensors.index.json` lists.

    Returns the tensors and a description of where they came from, for error messages.
    """
    directory = Path(directory)
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map") or {}
        files = sorted(set(weight_map.values()))
        if not files:
            raise ValueError(f"{index_path} lists no shards (empty weight_map)")
        source = f"{index_path} ({len(files)} shards)"
    elif (directory / WEIGHTS_FILE).is_file():
        files = [WEIGHTS_FILE]
        source = str(directory / WEIGHTS_FILE)
    else:
        found = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
        raise FileNotFoundError(f"no {WEIGHTS_FILE} or {INDEX_FILE} in {directory} (found: {found or 'nothing'})")
    tensors: dict[str, Tensor] = {}
    for name in files:
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"{index_path} names shard {name}, which is missing")
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open handle has keys(), no __iter__)
                if key in tensors:
                    raise ValueError(f"tensor {key} appears in more than one shard of {source}")
                # A fresh, allocator-aligned copy: tensors read at odd file offsets can take other
                # SIMD paths and differ from the saved model in the last bit.
                tensors[key] = f.get_tensor(key).clone()
    return tensors, source


def check_tensors(
    expected: Mapping[str, Iterable[int]], found: Mapping[str, Iterable[int]], source: str, what: str
) -> None:
    """Raise one ValueError listing missing names, unexpected names and shape mismatches, or return."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    mismatched = [
        f"{name}: expected {_shape(expected[name])} vs found {_shape(found[name])}"
        for name in sorted(set(expected) & set(found))
        if tuple(expected[name]) != tuple(found[name])
    ]
    if not (missing or unexpected or mismatched):
        return
    lines = [f"{source} does not match {what}:"]
    if missing:
        lines.append(f"  missing tensors ({len(missing)}): {', '.join(missing)}")
    if unexpected:
        lines.append(f"  unexpected tensors ({len(unexpected)}): {', '.join(unexpected)}")
    if mismatched:
        lines.append(f"  shape mismatches ({len(mismatched)}):")
        lines.extend(f"    {line}" for line in mismatched)
    raise ValueError("\n".join(lines))


def _build_and_load(
    config: DraftConfig, tensors: dict[str, Tensor], source: str, device: str | torch.device, dtype: torch.dtype | None
) -> DSparkModel | Eagle3Model:
    with torch.device("meta"):  # no random init of weights about to be replaced
        model = build_draft_model(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    check_tensors(expected, {name: tuple(t.shape) for name, t in tensors.items()}, source, _describe(config))
    dtype = dtype or tensors["fc.weight"].dtype
    model.load_state_dict({name: t.to(_float_dtype(t, dtype)) for name, t in tensors.items()}, strict=True, assign=True)
    model = model.to(device)
    model.embed_tokens.weight.requires_grad_(False)  # frozen copies of the target's
    model.lm_head.weight.requires_grad_(False)
    return model.eval()


def _float_dtype(tensor: Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """`dtype` for a floating-point tensor; an integer one (a draft vocabulary's ids) keeps its own."""
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def _describe(config: DraftConfig) -> str:
    parts = [f"{config.num_layers} layers", f"hidden {config.hidden_size}", f"vocab {config.vocab_size}"]
    if config.draft_vocab_size is not None:
        parts.append(f"draft vocabulary {config.draft_vocab_size}")
    if config.head != "none":
        w1 = ", W1 over the draft vocabulary" if config.markov_w1_rows == "draft" else ""
        parts.append(f"{config.head} head, rank {config.markov_rank}{w1}")
    if config.confidence_head:
        parts.append("confidence head")
    return f"a {config.method} draft ({', '.join(parts)})"


def _shape(shape: Iterable[int]) -> str:
    return f"[{', '.join(str(int(s)) for s in shape)}]"


def _normalise_names(tensors: dict[str, Tensor], source: str) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        key = name
        while key.startswith(_PREFIXES):
            key = key[next(len(p) for p in _PREFIXES if key.startswith(p)):]
        if key.split(".")[0] in IGNORED_TENSORS:
            continue
        if key in out:
            raise ValueError(f"{source}: two tensors map to {key} once prefixes are stripped")
        out[key] = tensor
    return out


def _fill_shared_embeddings(tensors: dict[str, Tensor], source: str, target: Any) -> tuple[dict[str, Tensor], str]:
    """Copy the target's embeddings / LM head in where the checkpoint leaves them to the target."""
    shared = [name for name in SHARED_WITH_TARGET if name not in tensors]
    if not shared:
        return tensors, source
    if target is None:
        raise ValueError(
            f"{source} has no {' / '.join(shared)}: the draft shares them with its target; "
            "pass target= (a TargetModel or Hugging Face causal LM) to copy them in"
        )
    embed, lm_head = _target_embedding_weights(target)
    if DRAFT_VOCAB_TENSOR in tensors:  # a reduced draft vocabulary: the head's rows of its tokens
        lm_head = lm_head[tensors[DRAFT_VOCAB_TENSOR].to(lm_head.device)]
    for name, weight in zip(SHARED_WITH_TARGET, (embed, lm_head)):
        if name in shared:
            tensors[name] = weight.detach().to("cpu").clone()
    return tensors, f"{source} (+ {', '.join(shared)} from the target)"


def _target_embedding_weights(target: Any) -> tuple[Tensor, Tensor]:
    if hasattr(target, "input_embeddings"):  # dspark_core.target.TargetModel
        return target.input_embeddings().weight, target.output_embeddings().weight
    if hasattr(target, "get_input_embeddings"):  # a Hugging Face model
        return target.get_input_embeddings().weight, target.get_output_embeddings().weight
    raise TypeError(f"target must be a TargetModel or a Hugging Face causal LM, got {type(target).__name__}")


# ---------------------------------------------------------------------------------------------------
# config.json fields


def _required(hf: Mapping[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise ValueError(f"draft config.json lacks {key!r}")
    return hf[key]


def _sub(hf: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = hf.get(key)
    return value if isinstance(value, Mapping) else {}


def _target_layer_ids(hf: Mapping[str, Any]) -> tuple[int, ...]:
    """First found, as vLLM looks: eagle_aux (vLLM's count, id − 1), dflash_config, dspark_, plain."""
    if hf.get("eagle_aux_hidden_state_layer_ids"):
        return tuple(int(i) - 1 for i in hf["eagle_aux_hidden_state_layer_ids"])
    for ids in (
        _sub(hf, "dflash_config").get("target_layer_ids"),
        hf.get("dspark_target_layer_ids"),
        hf.get("target_layer_ids"),
    ):
        if ids:
            return tuple(int(i) for i in ids)
    raise ValueError(
        "draft config.json names no target layers: expected one of eagle_aux_hidden_state_layer_ids, "
        "dflash_config.target_layer_ids, dspark_target_layer_ids, target_layer_ids"
    )


def _mask_token_id(hf: Mapping[str, Any]) -> int:
    for value in (
        _sub(hf, "dflash_config").get("mask_token_id"),
        hf.get("mask_token_id"),
        hf.get("dspark_noise_token_id"),
    ):
        if value is not None:
            return int(value)
    raise ValueError(
        "draft config.json has no mask token id: expected one of dflash_config.mask_token_id, "
        "mask_token_id, dspark_noise_token_id (the token id that fills block slots 1 … γ−1)"
    )


def _rope_theta(hf: Mapping[str, Any]) -> float:
    params = _sub(hf, "rope_parameters")
    scaling = _sub(hf, "rope_scaling")
    for rope in (params, scaling):
        kind = rope.get("rope_type") or rope.get("type")
        if kind not in (None, "default"):
            raise ValueError(f"unsupported DeepSpec draft config: rope type {kind!r}; only default RoPE is supported")
    theta = hf.get("rope_theta") or params.get("rope_theta")
    if theta is None:
        raise ValueError("draft config.json lacks 'rope_theta' (or rope_parameters.rope_theta)")
    return float(theta)


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    # safetensors creates its file 0600 whatever the umask: a draft in a shared models directory would be
    # unreadable to everyone but its writer. Give it the mode any other new file gets.
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
