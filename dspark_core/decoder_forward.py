"""A lean forward of Llama-family decoders (Llama, Mistral, Qwen2, Qwen3) straight over KV slots.

Hugging Face's forward costs a decode step more than its matmuls on the CPU: per layer it threads kwargs
through decorators, updates a cache object, records hidden states through output hooks, and its SDPA
path converts a boolean mask to an additive one in every layer. At SmolLM2-135M's shape (30 layers,
hidden 576) that overhead was a third of a batch-1 step. This forward runs the model's own submodules
(the same norms, projections, rotary embedding and MLP, so the numbers are Hugging Face's) in one plain
loop: q/k/v and gate/up as one matmul each (`fuse_projections`, bit-identical), fp32 RMSNorm as one
op, q and k rotated together, one additive mask per forward, the new keys/values written once into the
slots (`SlotWindow`), features taken from the chosen layers' outputs, and logits only where asked. In fp32
on the CPU every projection and the LM head run over oneDNN's prepacked weights (`packed`): 2–3× MKL's
speed at the few rows of a decode or verify step, and a row's result independent of the rows beside it.

`supports(model)` says whether a model has that shape; `TargetModel` keeps Hugging Face's own forward
for everything else (other architectures, eager or varlen attention, sliding windows).
"""

from __future__ import annotations

import sys
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark_core.decode_attention import decode_attention, takes
from dspark_core.kv_slots import SlotWindow
from dspark_core.kernels.bf16_linear_cpu import PairPacked
from dspark_core.packed_linear import pack, packed_linear, weight_key

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


class Proj(NamedTuple):
    """One projection as the forward runs it: the weight (when `packed`, `packed_linear.pack`'s copy: the bf16
    kernel's or oneDNN's) and its bias."""

    weight: Tensor | PairPacked
    bias: Tensor | None
    packed: bool = False

    def __call__(self, x: Tensor) -> Tensor:
        return packed_linear(x, self.weight, self.bias) if self.packed else F.linear(x, self.weight, self.bias)


class FusedLayer(NamedTuple):
    """One layer's projections as four matmuls instead of seven: q, k, v stacked, and gate, up stacked."""

    qkv: Proj  # [(heads + 2 kv_heads) · head_dim, hidden]
    o: Proj
    gate_up: Proj  # [2 · intermediate, hidden]
    down: Proj


class Fused(NamedTuple):
    """What `decoder_forward` runs besides the model's modules, built once per weight set (`fused_for`)."""

    layers: list[FusedLayer]
    head: Proj
    pack: bool  # built with prepacking asked for
    bf16_kernel: bool  # and with the bf16 kernel allowed where it runs (else oneDNN's packing)
    packed_from: tuple[nn.Module, ...]  # the modules whose weights were packed (copies: stale once one changes)
    key: tuple  # their weights' `weight_key` when packed


def packed(weight: Tensor, bias: Tensor | None, do_pack: bool, bf16_kernel: bool = True) -> Proj:
    """A projection over a packed copy of `weight` where `do_pack` and it is `packable` (`dspark_core.packed_linear`:
    oneDNN's, 2–3× MKL's fp32 speed at a few rows on this CPU, or the bf16 kernel's where it runs; row-independent
    results either way), else over the weight itself. The whole forward, paired:
    `python3 -m benchmarks.target_forward --against unpacked --tokens 1 8`."""
    blocked = pack(weight, bf16_kernel) if do_pack else None
    if blocked is None:
        return Proj(weight, bias)
    return Proj(blocked, None if bias is None else bias.detach(), True)


def fuse_projections(model: nn.Module) -> list[tuple[tuple[Tensor, Tensor | None], tuple[Tensor, Tensor | None]]]:
    """Stack each layer's q/k/v and gate/up weights, and make the modules' own weights views of the stacks.

    A matmul's output column depends only on its weight row (MKL's kernels give bit-identical columns
    for one stacked matmul and for the separate ones; `tests/dspark_core/test_decoder_forward.py` checks
    the whole forward), so this changes no number, and as views the stacks cost no memory and stay
    what Hugging Face's own forward reads. Called again when the weights moved (`fused_for`)."""
    fused = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        fused.append((_stack([attn.q_proj, attn.k_proj, attn.v_proj]), _stack([mlp.gate_proj, mlp.up_proj])))
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


def fused_for(model: nn.Module, fused: Fused | None, pack: bool = True, bf16_kernel: bool = True) -> Fused:
    """`fused` if the modules' weights are still the ones it was built from, else built afresh (after
    `model.to(…)`, a new state dict or an in-place write to a packed weight). `pack`: every projection and the
    LM head over prepacked weights where that pays (`packed`; `bf16_kernel`: this project's bf16 kernel where it
    runs, else oneDNN's). Runs at every forward: it checks the
    first stack's address (the unpacked stacks are the modules' own memory) and only the packed weights' keys."""
    if fused is not None and fused.pack == pack and fused.bf16_kernel == bf16_kernel:
        q = model.model.layers[0].self_attn.q_proj.weight
        stack = fused.layers[0].qkv
        same = stack.packed or (q.data_ptr() == stack.weight.data_ptr() and q.dtype == stack.weight.dtype)
        if same and fused.key == tuple(weight_key(m.weight) for m in fused.packed_from):
            return fused
    layers, packed_from = [], []
    for layer, (qkv, gate_up) in zip(model.model.layers, fuse_projections(model)):
        attn, mlp = layer.self_attn, layer.mlp
        f = FusedLayer(packed(*qkv, pack, bf16_kernel), packed(attn.o_proj.weight, attn.o_proj.bias, pack, bf16_kernel),
                       packed(*gate_up, pack, bf16_kernel),
                       packed(mlp.down_proj.weight, mlp.down_proj.bias, pack, bf16_kernel))
        for proj, modules in zip(f, ([attn.q_proj, attn.k_proj, attn.v_proj], [attn.o_proj],
                                     [mlp.gate_proj, mlp.up_proj], [mlp.down_proj])):
            if proj.packed:  # a module's weight made a view of its stack keeps its own version counter
                packed_from += modules
        layers.append(f)
    head = packed(model.lm_head.weight, model.lm_head.bias, pack, bf16_kernel)
    if head.packed:
        packed_from.append(model.lm_head)
    return Fused(layers, head, pack, bf16_kernel, tuple(packed_from), tuple(weight_key(m.weight) for m in packed_from))


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`apply_rotary_pos_emb` of the Llama family for one tensor [R, heads, n, head_dim], op for op."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def _rms_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """A Llama-family RMSNorm as one fused op (`torch.rms_norm`) instead of the module's six: in fp32 with the
    weight inside, bit-identical to Hugging Face's x · rsqrt(mean(x²) + ε) · w; in bf16 (or fp16) as Hugging Face
    computes it, normalised in fp32, rounded, then scaled by the weight in the model's dtype (bit-identical too,
    tests/dspark_core/test_decoder_forward.py). Anything else runs the module itself."""
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None or norm.weight.dtype != x.dtype:
        return norm(x)
    if x.dtype == torch.float32:
        return torch.rms_norm(x, (x.shape[-1],), norm.weight, eps)
    if x.dtype in (torch.bfloat16, torch.float16):
        return norm.weight * torch.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
    return norm(x)


@torch.no_grad()
def decoder_forward(
    model: nn.Module,
    fused: Fused,
    window: SlotWindow,
    token_ids: Tensor,  # [R, max_new]
    layer_ids: Sequence[int],
    logits_at: Tensor | None = None,  # [U] positions to compute logits at (None: all)
    decode_products: bool = True,
    fused_pointwise: bool = True,
) -> tuple[Tensor, Tensor]:
    """(logits [R, U or max_new, vocab] in the model's dtype, features [R, max_new, len(layer_ids) * hidden]).

    `decode_products`: a bf16/fp16 decode or verify step on the CPU (≤ 16 new positions per row) computes attention
    as fp32 products (`decode_attention.py`, a C++ kernel where it builds: 2–4× torch's SDPA per step there, as
    exact, and a verify step's query the bits of a decode step's at its position); False keeps SDPA everywhere.
    `fused_pointwise`: a bf16 Llama-family forward on the CPU runs each layer's RMSNorms (with the residual add),
    rotary and SiLU·up as one C++ call each (`kernels/decoder_pointwise_cpu.py`: the same roundings as Hugging
    Face's ops; the norm and SiLU within one bf16 rounding of them); False keeps the eager ops, bit-identical."""
    base = model.model
    num_rows, max_new = token_ids.shape
    hidden = base.embed_tokens(token_ids)
    cos, sin = base.rotary_emb(hidden, window.positions)  # Hugging Face's own: the same numbers
    pointwise = fused_pointwise and pointwise_fits(model, hidden.dtype, hidden.device)
    if pointwise:
        from dspark_core.kernels import decoder_pointwise_cpu as pw

        cos_rows, sin_rows = cos, sin  # [R, max_new, head_dim], as the kernel reads them
    # A prefill into empty slots (every row's new positions from 0) is plain causal attention: SDPA's own causal
    # path skips the blocks above the diagonal (the same numbers as the mask's; 11% of a prefill's attention here).
    causal = window.uniform and window.total == max_new
    few = decode_products and takes(max_new, hidden.dtype, hidden.device)  # a decode or verify step on the CPU
    visible = window.positions + 1 if few else None  # [R, max_new] keys each new query attends to
    mask = None if causal or few else additive_mask(window, hidden.dtype)
    first = base.layers[0].self_attn
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [R, 1, max_new, head_dim], over the heads
    heads, head_dim = first.q_proj.weight.shape[0] // first.head_dim, first.head_dim
    kv_heads = first.k_proj.weight.shape[0] // head_dim
    per_head_norm = hasattr(first, "q_norm")  # Qwen3: RMSNorm per head on q and k, before the rotary
    wanted = set(layer_ids)
    features = [hidden] if -1 in wanted else []
    if pointwise:  # each layer's input norm is done by the call that adds the layer before it
        norm = base.layers[0].input_layernorm
        _, x = pw.add_rms_norm(hidden, None, norm.weight, norm.variance_epsilon)
    for index, (layer, f) in enumerate(zip(base.layers, fused.layers)):
        attn = layer.self_attn
        if not pointwise:
            x = _rms_norm(layer.input_layernorm, hidden)
        qkv = f.qkv(x).view(num_rows, max_new, heads + 2 * kv_heads, head_dim)
        if pointwise:
            qk = pw.rope(qkv, heads + kv_heads, cos_rows, sin_rows)
            q, k = qk[:, :heads], qk[:, heads:]
        elif per_head_norm:
            q = _rope(_rms_norm(attn.q_norm, qkv[:, :, :heads]).transpose(1, 2), cos, sin)
            k = _rope(_rms_norm(attn.k_norm, qkv[:, :, heads : heads + kv_heads]).transpose(1, 2), cos, sin)
        else:  # q and k rotated as one tensor: the same elementwise numbers, half the small ops
            qk = _rope(qkv[:, :, : heads + kv_heads].transpose(1, 2), cos, sin)
            q, k = qk[:, :heads], qk[:, heads:]
        keys, values = window.write(index, k, qkv[:, :, heads + kv_heads :].transpose(1, 2))
        if few:
            out = decode_attention(q, keys, values, visible, attn.scaling)
        else:
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, is_causal=causal, scale=attn.scaling, enable_gqa=kv_heads != heads
            )
        attended = f.o(out.transpose(1, 2).reshape(num_rows, max_new, -1))
        post = layer.post_attention_layernorm
        if pointwise:
            hidden, y = pw.add_rms_norm(hidden, attended, post.weight, post.variance_epsilon)
            down = f.down(pw.silu_mul(f.gate_up(y)))
            norm = base.layers[index + 1].input_layernorm if index + 1 < len(base.layers) else base.norm
            hidden, x = pw.add_rms_norm(hidden, down, norm.weight, norm.variance_epsilon)  # the next norm's input
        else:
            hidden = hidden + attended
            gate, up = f.gate_up(_rms_norm(post, hidden)).chunk(2, -1)
            hidden = hidden + f.down(layer.mlp.act_fn(gate) * up)
        if index in wanted:
            features.append(hidden)
    hidden = x if pointwise else _rms_norm(base.norm, hidden)  # pointwise: the last call normed it
    if logits_at is not None:
        hidden = hidden[:, logits_at]
    logits = fused.head(hidden)
    if features:
        feats = torch.cat(features, dim=-1) if len(features) > 1 else features[0]
    else:
        feats = token_ids.new_zeros((num_rows, max_new, 0), dtype=hidden.dtype)
    return logits, feats


def pointwise_fits(model: nn.Module, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a lean forward of `model` runs its elementwise steps as C++ calls: a bf16 Llama-family model (no
    per-head q/k norms, SiLU MLP, weighted RMSNorms) on the CPU, with the kernels built."""
    from dspark_core.kernels import decoder_pointwise_cpu

    base = model.model
    first = base.layers[0]
    if hasattr(first.self_attn, "q_norm") or getattr(model.config, "hidden_act", None) != "silu":
        return False
    norms = (base.norm, first.input_layernorm, first.post_attention_layernorm)  # `.to(dtype)` moves them all alike
    if not all(getattr(n, "variance_epsilon", None) is not None and n.weight.dtype == torch.bfloat16 for n in norms):
        return False
    return decoder_pointwise_cpu.ready(dtype, device)

