"""A lean forward of Llama-family decoders (Llama, Mistral, Qwen2, Qwen3) straight over KV slots.

Hugging Face's forward costs a decode step more than its matmuls on the CPU: per layer it threads kwargs
through decorators, updates a cache object, records hidden states through output hooks, and its SDPA
path converts a boolean mask to an additive one in every layer. At SmolLM2-135M's shape (30 layers,
hidden 576) that overhead was a third of a batch-1 step. This forward runs the model's own submodules
(the same norms, projections, rotary embedding and MLP, so the numbers are Hugging Face's) in one plain
loop: q/k/v and gate/up as one matmul each (`fuse_projections`, bit-identical), fp32 RMSNorm as one
op, q and k rotated together, one additive mask per forward, the new keys/values written once into the
slots (`SlotWindow`), features taken from the chosen layers' outputs, and logits only where asked.

`supports(model)` says whether a model has that shape; `TargetModel` keeps Hugging Face's own forward
for everything else (other architectures, eager or varlen attention, sliding windows).
"""

from __future__ import annotations

import sys
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark_core.kv_slots import SlotWindow

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_PARTS = ("gate_proj", "up_proj", "down_proj")


def supports(model: nn.Module) -> bool:
    """A causal LM of the Llama family with full attention everywhere, on "sdpa" or "dspark_sdpa" attention."""
    config = model.config
    if getattr(config, "model_type", None) not in LLAMA_FAMILY:
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "dspark_sdpa"):
        return False
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return False
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        return False
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, p) for p in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if not hasattr(model, "lm_head"):
        return False
    for layer in base.layers:
        if not all(hasattr(layer, p) for p in _LAYER_PARTS):
            return False
        if not all(hasattr(layer.self_attn, p) for p in _ATTN_PARTS + ("scaling", "head_dim")):
            return False
        if not all(isinstance(getattr(layer.mlp, p, None), nn.Linear) for p in _MLP_PARTS) or not hasattr(layer.mlp, "act_fn"):
            return False
    return _rotary_of(base.layers[0].self_attn) is not None


def _rotary_of(attn: nn.Module) -> Callable | None:
    """The model file's own `apply_rotary_pos_emb` (numerics as Hugging Face's)."""
    return getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)


def additive_mask(window: SlotWindow, dtype: torch.dtype) -> Tensor:
    """[R, 1, max_new, total] additive mask: query j of row r sees key p iff p ≤ past_r + j.

    Every row's new keys sit right behind its own cached ones (`SlotWindow.write`), so this one comparison
    is causal over the new positions and hides each row's unused tail. A padded query (j ≥ num_new) sees a
    few stale but finite positions: its output is garbage the caller ignores, never NaN.
    """
    key_pos = torch.arange(window.total, device=window.past_lengths.device)
    last = window.positions  # [R, max_new]: past_r + j
    visible = key_pos[None, None, :] <= last[:, :, None]  # [R, max_new, total]
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


class FusedLayer(NamedTuple):
    """One layer's projections as two matmuls instead of five: q, k, v stacked, and gate, up stacked."""

    qkv_weight: Tensor  # [(heads + 2 kv_heads) · head_dim, hidden]
    qkv_bias: Tensor | None
    gate_up_weight: Tensor  # [2 · intermediate, hidden]
    gate_up_bias: Tensor | None


class Fused(NamedTuple):
    """What `decoder_forward` runs besides the model's modules, built once per weight set (`fused_for`)."""

    layers: list[FusedLayer]
    head: Tensor | None  # the LM head's weight prepacked for oneDNN (`packed_head`), or None: `lm_head` itself
    head_key: tuple[int, int, torch.dtype]  # the LM head weight's (address, version, dtype) when `head` was packed


def packed_head(weight: Tensor) -> Tensor | None:
    """The LM head's weight in oneDNN's blocked layout, where that is the faster matmul: fp32 on the CPU.

    The LM head (vocab × hidden: 49,152 × 576 on SmolLM2) is the largest matmul of a decode step; MKL's
    matmul runs it at 12 GFLOP/s on this AVX2 CPU at 16 rows, oneDNN's over the prepacked weight at twice
    that (and 0.9× the time at 1 row). vLLM's CPU backend prepacks every linear the same way. Unlike MKL's,
    oneDNN's result for a row does not depend on how many rows are multiplied with it, so a verify step's
    logits equal a plain step's. Costs a copy of the weight (the head is tied to the embeddings)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    except (RuntimeError, AttributeError):  # pragma: no cover - a torch without these ops
        return None


def fuse_projections(model: nn.Module) -> list[FusedLayer]:
    """Stack each layer's q/k/v and gate/up weights, and make the modules' own weights views of the stacks.

    A matmul's output column depends only on its weight row (MKL's kernels give bit-identical columns
    for one stacked matmul and for the separate ones; `tests/dspark_core/test_decoder_forward.py` checks
    the whole forward), so this changes no number, and as views the stacks cost no memory and stay
    what Hugging Face's own forward reads. Called again when the weights moved (`fused_for`)."""
    fused = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        fused.append(FusedLayer(*_stack([attn.q_proj, attn.k_proj, attn.v_proj]), *_stack([mlp.gate_proj, mlp.up_proj])))
    return fused


def _stack(linears: list[nn.Linear]) -> tuple[Tensor, Tensor | None]:
    weight = torch.cat([m.weight.detach() for m in linears])
    has_bias = [m.bias is not None for m in linears]
    bias = torch.cat([m.bias.detach() for m in linears]) if all(has_bias) else None
    if any(has_bias) and bias is None:
        raise ValueError("some projections have a bias and some not")
    start = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = weight[start : start + n]
        if bias is not None:
            m.bias.data = bias[start : start + n]
        start += n
    return weight, bias


def fused_for(model: nn.Module, fused: Fused | None, pack_head: bool = True) -> Fused:
    """`fused` if the modules' weights are still the ones it was built from, else built afresh (after
    `model.to(…)` or a new state dict). `pack_head`: prepack the LM head (`packed_head`) where it pays."""
    head = model.lm_head.weight
    if fused is not None:
        q = model.model.layers[0].self_attn.q_proj.weight
        same = q.data_ptr() == fused.layers[0].qkv_weight.data_ptr() and q.dtype == fused.layers[0].qkv_weight.dtype
        if same and fused.head_key == _key(head) and (fused.head is not None) == (pack_head and _packable(head)):
            return fused
    return Fused(fuse_projections(model), packed_head(head) if pack_head else None, _key(head))


def _key(weight: Tensor) -> tuple[int, int, torch.dtype]:
    """Changes when the weight moves or is written in place (a packed copy would be stale). An inference
    tensor (made under `torch.inference_mode`, as the GPU check loads its target) keeps no version counter,
    and nothing outside inference mode can write it in place, so its address and dtype are the key."""
    return weight.data_ptr(), -1 if weight.is_inference() else weight._version, weight.dtype


def _packable(weight: Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`apply_rotary_pos_emb` of the Llama family for one tensor [R, heads, n, head_dim], op for op."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def _rms_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """A Llama-family RMSNorm: in fp32 one fused op (`torch.rms_norm`, bit-identical to Hugging Face's
    x · rsqrt(mean(x²) + ε) · w there); in other dtypes the module itself (it computes in fp32 and rounds)."""
    eps = getattr(norm, "variance_epsilon", None)
    if x.dtype != torch.float32 or eps is None or norm.weight.dtype != torch.float32:
        return norm(x)
    return torch.rms_norm(x, (x.shape[-1],), norm.weight, eps)


@torch.no_grad()
def decoder_forward(
    model: nn.Module,
    fused: Fused,
    window: SlotWindow,
    token_ids: Tensor,  # [R, max_new]
    layer_ids: Sequence[int],
    logits_at: Tensor | None = None,  # [U] positions to compute logits at (None: all)
) -> tuple[Tensor, Tensor]:
    """(logits [R, U or max_new, vocab] in the model's dtype, features [R, max_new, len(layer_ids) * hidden])."""
    base = model.model
    num_rows, max_new = token_ids.shape
    hidden = base.embed_tokens(token_ids)
    cos, sin = base.rotary_emb(hidden, window.positions)  # Hugging Face's own: the same numbers
    mask = additive_mask(window, hidden.dtype)
    first = base.layers[0].self_attn
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [R, 1, max_new, head_dim], over the heads
    heads, head_dim = first.q_proj.weight.shape[0] // first.head_dim, first.head_dim
    kv_heads = first.k_proj.weight.shape[0] // head_dim
    per_head_norm = hasattr(first, "q_norm")  # Qwen3: RMSNorm per head on q and k, before the rotary
    wanted = set(layer_ids)
    features = [hidden] if -1 in wanted else []
    for index, (layer, f) in enumerate(zip(base.layers, fused.layers)):
        attn = layer.self_attn
        x = _rms_norm(layer.input_layernorm, hidden)
        qkv = F.linear(x, f.qkv_weight, f.qkv_bias).view(num_rows, max_new, heads + 2 * kv_heads, head_dim)
        if per_head_norm:
            q = _rope(_rms_norm(attn.q_norm, qkv[:, :, :heads]).transpose(1, 2), cos, sin)
            k = _rope(_rms_norm(attn.k_norm, qkv[:, :, heads : heads + kv_heads]).transpose(1, 2), cos, sin)
        else:  # q and k rotated as one tensor: the same elementwise numbers, half the small ops
            qk = _rope(qkv[:, :, : heads + kv_heads].transpose(1, 2), cos, sin)
            q, k = qk[:, :heads], qk[:, heads:]
        keys, values = window.write(index, k, qkv[:, :, heads + kv_heads :].transpose(1, 2))
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=kv_heads != heads
        )
        hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(num_rows, max_new, -1))
        mlp = layer.mlp
        gate, up = F.linear(_rms_norm(layer.post_attention_layernorm, hidden), f.gate_up_weight, f.gate_up_bias).chunk(2, -1)
        hidden = hidden + mlp.down_proj(mlp.act_fn(gate) * up)
        if index in wanted:
            features.append(hidden)
    hidden = _rms_norm(base.norm, hidden)
    if logits_at is not None:
        hidden = hidden[:, logits_at]
    if fused.head is not None:
        logits = torch.ops.mkldnn._linear_pointwise(hidden, fused.head, model.lm_head.bias, "none", [], "")
    else:
        logits = model.lm_head(hidden)
    if features:
        feats = torch.cat(features, dim=-1) if len(features) > 1 else features[0]
    else:
        feats = token_ids.new_zeros((num_rows, max_new, 0), dtype=hidden.dtype)
    return logits, feats
