"""Building what the in-house engine runs: the target, the drafter, the policy and the engine, from the specs.

One path for every caller that needs an engine — the backend for a suite cell (`backends.inhouse.adapter`),
our OpenAI server (`backends.inhouse.server`), the audit's scorer — so the same specs give the same model
weights, drafter, policy, stop tokens and context bound everywhere; greedy output through the server then
equals the backend's for the same prompt ids. Loading is slow and a suite reuses a target across many
cells, so `Models` keeps what it loaded (and what it profiled) until `close`.

Specs come as the contracts' `TargetSpec` / `DrafterSpec` / `PolicySpec`; nothing here needs a `Cell`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from backends.inhouse.engine import Engine, EngineConfig
from backends.inhouse.policy import build_policy
from contracts.backend import BackendError
from contracts.cells import DrafterSpec, PolicySpec, TargetSpec
from contracts.names import CONFIDENCE_METHODS, CONFIDENCE_POLICIES, DTYPES
from inputs import model_refs
from inputs.tasks.prompts import stop_tokens

TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


@dataclass
class LoadedTarget:
    model: Any  # dspark_core.target.TargetModel
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    fingerprint: str  # model_refs.fingerprint of its files (provenance: target_hash)
    tables: dict[Any, Any] = field(default_factory=dict)  # SPS / step-cost tables profiled on it (policy.py)


@dataclass
class LoadedDrafter:
    drafter: Any  # a dspark_core Drafter
    draft_hash: str = ""  # fingerprint of its checkpoint ("" without one)
    sts: dict[str, tuple[float, ...]] = field(default_factory=dict)  # decoding temperature "%g" → STS T_j [γ]
    sts_offsets: dict[str, tuple[float, ...]] = field(default_factory=dict)  # "%g" → level offsets b_j [γ], if fitted

    def temperatures(self, temperature: float, num_drafts: int) -> tuple[float, ...] | None:
        """The drafter's STS temperatures for this decoding temperature, cut to γ; None where it has none."""
        sts = self.sts.get(f"{temperature:g}")
        return tuple(sts[:num_drafts]) if sts and num_drafts > 0 else None

    def offsets(self, temperature: float, num_drafts: int) -> tuple[float, ...] | None:
        """The level offsets fitted beside those temperatures (`calibration.fit_sts_level`), cut to γ; None
        where the draft has none (a draft calibrated by STS alone)."""
        if self.temperatures(temperature, num_drafts) is None:
            return None
        b = self.sts_offsets.get(f"{temperature:g}")
        return tuple(b[:num_drafts]) if b else None


@dataclass
class Built:
    """An engine's parts for one (target, drafter, γ, policy), before the engine itself."""

    target: LoadedTarget
    drafter: LoadedDrafter
    policy: Any  # a dspark_core VerifyPolicy, or None (verify every draft)
    temperatures: tuple[float, ...] | None  # STS temperatures the policy calibrates with (also the ECE's)
    offsets: tuple[float, ...] | None  # the level offsets fitted with them, or None
    note: str  # what building the policy reported (a profiled SPS or step-cost table), or ""


@dataclass
class BuiltEngine:
    """An engine ready to serve, with what a server needs beside it."""

    engine: Engine
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    note: str


def device_for(device: str | None, num_threads: int | None = None) -> torch.device:
    """The torch device the options name (default: cuda if there is one), torch's thread count set."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def check_specs(target: TargetSpec, drafter: DrafterSpec, policy: PolicySpec, temperature: float = 0.0) -> None:
    """BackendError if these specs cannot run in house (missing files, a policy the drafter cannot serve)."""
    if temperature > 0 and target.dtype not in TORCH_DTYPES:
        raise BackendError(f"dtype {target.dtype!r} unknown; valid: {', '.join(TORCH_DTYPES)}")
    missing = model_refs.first_missing((target.path, drafter.checkpoint))
    if missing:
        raise BackendError(missing)
    if policy.name in CONFIDENCE_POLICIES and drafter.method not in CONFIDENCE_METHODS:
        raise BackendError(
            f"policy {policy.name!r} needs confidences, which only dspark drafts have "
            f"(drafter {drafter.name!r} is {drafter.method}); use policy full or static"
        )


class Models:
    """Targets and drafters loaded on one device, kept for the next cells of a run."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._targets: dict[tuple[str, str], LoadedTarget] = {}
        self._drafters: dict[tuple, LoadedDrafter] = {}

    def close(self) -> None:
        self._targets.clear()
        self._drafters.clear()

    def target(self, spec: TargetSpec) -> LoadedTarget:
        from transformers import AutoTokenizer

        from dspark_core.target import TargetModel

        ref = model_refs.resolve(spec.path)
        key = (ref.location, spec.dtype)
        if key not in self._targets:
            model = TargetModel.from_pretrained(ref.location, dtype=TORCH_DTYPES[spec.dtype], device=self.device)
            if model.lean and model.dtype == torch.bfloat16 and model.device.type == "cpu":
                from dspark_core.kernels import cpu_build

                for kernel in ("decode_attention", "decoder_pointwise", "bf16_linear"):  # built (≈ 1 s each, once per machine)
                    cpu_build.load(kernel)  # or found wanting now, not inside a timed cell
            tokenizer = AutoTokenizer.from_pretrained(ref.location)
            self._targets[key] = LoadedTarget(model, tokenizer, stop_tokens(tokenizer), model_refs.fingerprint(ref))
        return self._targets[key]

    def drafter(self, spec: DrafterSpec, target_spec: TargetSpec, target: LoadedTarget) -> LoadedDrafter:
        from dspark_core.drafters import as_drafter, build_drafter
        from dspark_core.packed_linear import pack_linears

        key = (spec.method, spec.checkpoint, spec.head, id(target))
        if key not in self._drafters:
            if spec.method in ("none", "ngram"):
                loaded = LoadedDrafter(build_drafter(spec.method))
            elif spec.method == "draft_model":
                loaded = load_draft_model(spec, target_spec, target)
            else:
                ref = model_refs.resolve(spec.checkpoint or "")
                model = load_weighted_draft(ref, target)
                if model.config.method != spec.method:
                    raise BackendError(f"checkpoint {spec.checkpoint} holds a {model.config.method!r} draft, "
                                       f"not {spec.method!r}")
                if spec.head is not None and getattr(model.config, "head", None) != spec.head:
                    raise BackendError(f"checkpoint {spec.checkpoint} has the {model.config.head!r} head, "
                                       f"the cell asks for {spec.head!r}")
                pack_linears(model)  # on the CPU, fp32 (bf16 where native): oneDNN's prepacked matmuls (dspark_core.packed_linear)
                sts = model.config.extra.get("sts_temperatures") or {}
                offsets = model.config.extra.get("sts_offsets") or {}
                loaded = LoadedDrafter(as_drafter(model), model_refs.fingerprint(ref),
                                       {t: tuple(v) for t, v in sts.items()}, {t: tuple(v) for t, v in offsets.items()})
            self._drafters[key] = loaded
        return self._drafters[key]

    def build(self, target: TargetSpec, drafter: DrafterSpec, num_drafts: int, policy: PolicySpec, *,
              temperature: float = 0.0, rows: int = 64) -> Built:
        """Target, drafter (the target told which hidden layers it feeds), STS temperatures and policy for
        these specs; `rows`: the most requests one step decodes (what a profiled step-cost table must cover)."""
        check_specs(target, drafter, policy, temperature)
        loaded = self.target(target)
        draft = self.drafter(drafter, target, loaded)
        layer_ids = tuple(getattr(draft.drafter, "target_layer_ids", ()) or ())
        if loaded.model.layer_ids != layer_ids:
            loaded.model.set_layer_ids(layer_ids)  # () for plain / n-gram: no hidden states computed
        plain = drafter.method == "none"
        temperatures = None if plain else draft.temperatures(temperature, num_drafts)
        offsets = None if plain else draft.offsets(temperature, num_drafts)
        verify_policy, note = build_policy(policy, plain, num_drafts, loaded, draft.drafter, temperatures,
                                           drafter_key=(drafter.method, drafter.checkpoint, drafter.head), rows=rows,
                                           offsets=offsets)
        return Built(loaded, draft, verify_policy, temperatures, offsets, note)


def build_engine(built: Built, num_drafts: int, num_slots: int, max_context: int, *, longest: int = 0,
                 verifier=None) -> Engine:
    """The engine over `built`: `num_slots` requests at once, each holding at most `max_context` tokens (cut to
    the target's own limit, but never below `longest`, what the caller's longest request needs)."""
    context = min(max_context, getattr(built.target.model.config, "max_position_embeddings", 1 << 30))
    config = EngineConfig(num_slots=num_slots, max_context=max(context, longest), num_drafts=max(num_drafts, 1))
    return Engine(built.target.model, built.drafter.drafter, config, built.policy, verifier=verifier)


def serving_engine(models: Models, target: TargetSpec, drafter: DrafterSpec, num_drafts: int, policy: PolicySpec, *,
                   temperature: float = 0.0, num_slots: int = 64, max_context: int = 2048) -> BuiltEngine:
    """The engine a suite cell with these specs would run, for a caller that serves it (our OpenAI server): same
    loading, drafter, policy (with the drafter's STS temperatures for `temperature`) and stop tokens."""
    built = models.build(target, drafter, num_drafts, policy, temperature=temperature, rows=num_slots)
    engine = build_engine(built, num_drafts, num_slots, max_context)
    return BuiltEngine(engine, built.target.tokenizer, built.target.stop_token_ids, built.note)


def load_draft_model(spec: DrafterSpec, target_spec: TargetSpec, target: LoadedTarget) -> LoadedDrafter:
    """A Hugging Face causal LM as the draft, on the target's device and dtype. The target's own checkpoint
    (`embedded` for the embedded default) shares the target's weights rather than loading them twice; any
    other must have the target's vocabulary and tokenizer."""
    from dspark_core.drafters import DraftModelDrafter, VocabularyMismatch, load_draft_model as load_lm

    ref = model_refs.resolve(spec.checkpoint or "")
    try:
        if ref.location == model_refs.resolve(target_spec.path).location:
            drafter = DraftModelDrafter(target.model, target=target.model)
        else:
            drafter = load_lm(ref.location, target=target.model, target_tokenizer=target.tokenizer)
    except VocabularyMismatch as exc:
        raise BackendError(f"drafter {spec.name!r} ({spec.checkpoint}): {exc}") from None
    except (OSError, ValueError) as exc:
        raise BackendError(f"drafter {spec.name!r}: cannot load {spec.checkpoint} "
                           f"({ref.location}) as a Hugging Face causal LM: {exc}") from None
    return LoadedDrafter(drafter, model_refs.fingerprint(ref))


def load_weighted_draft(ref: model_refs.ModelRef, target: LoadedTarget):
    """A draft in our format (draft_config.json), else a released DeepSpec / vLLM-layout checkpoint
    (config.json: `Qwen3DSparkModel`, DSpark or DFlash); a hub id is fetched into (or read from) the HF cache."""
    from dspark_core.checkpoint import load_deepspec_draft, load_draft

    location = Path(ref.location)
    if not ref.is_local:
        from huggingface_hub import snapshot_download

        location = Path(snapshot_download(ref.location))
    load = load_draft if (location / "draft_config.json").is_file() or not (location / "config.json").is_file() \
        else load_deepspec_draft
    return load(location, device=target.model.device, dtype=target.model.dtype, target=target.model)
