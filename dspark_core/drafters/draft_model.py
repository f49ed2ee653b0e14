"""`draft_model`: a separate, smaller causal LM drafts γ tokens autoregressively (vLLM's `draft_model`,
SGLang's `STANDALONE`; the classic speculative decoding of Leviathan et al. and Chen et al.).

The draft is any Hugging Face causal LM that shares the target's vocabulary. It reads no target features
(`target_layer_ids = ()`): its only context is the committed tokens, which it keeps in its own per-slot KV
cache. That cache is a `TargetModel` slot cache, reused rather than rewritten: a forward over a batch of
slots of different lengths, and rollback by lowering a length.

Per slot the cache holds every committed position except the anchor (the last committed token), the
same invariant as the loop's `observe` calls: `observe` runs the draft over newly committed positions,
and `propose` starts from the anchor. `propose` runs γ one-token forwards (anchor, d_1, …, d_{γ−1}),
sampling d_k from softmax(logits / T) with each request's temperature and generator
(`dspark_core.distributions`, greedy below GREEDY_TEMPERATURE), and returns the exact draft distributions
so rejection sampling stays lossless; then it rolls the cache back to the committed length, since which
drafts survive is verification's decision, and `observe` adds the accepted ones afterwards.

A row whose anchor sits near the end of its slot drafts only as many tokens as the slot has room for
(`DraftProposal.num_valid`), rather than overflowing the cache; the generation loop never verifies more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dspark_core.distributions import draw_position, draw_uniforms, is_greedy
from dspark_core.drafters.base import DraftProposal, DraftStep
from dspark_core.kv_slots import KVSlots
from dspark_core.target import TargetModel


class VocabularyMismatch(ValueError):
    """The draft and the target do not share a vocabulary, so draft tokens would mean other words."""


def check_vocab_size(draft_vocab_size: int, target_vocab_size: int) -> None:
    """Rejection sampling compares p_d and p_t token by token: both need the same vocabulary size."""
    if draft_vocab_size != target_vocab_size:
        raise VocabularyMismatch(
            f"the draft model's vocabulary has {draft_vocab_size} tokens, the target's {target_vocab_size}: "
            "a draft_model drafter needs a draft with the target's tokenizer and vocabulary size "
            "(e.g. a smaller model of the same family)"
        )


def check_tokenizers(draft_tokenizer: Any, target_tokenizer: Any) -> None:
    """Equal sizes are not enough: the same id must be the same token. Compares the token → id maps."""
    draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    if draft_vocab == target_vocab:
        return
    differ = sorted(t for t in draft_vocab.keys() ^ target_vocab.keys())[:3]
    moved = [t for t in draft_vocab.keys() & target_vocab.keys() if draft_vocab[t] != target_vocab[t]][:3]
    raise VocabularyMismatch(
        f"the draft model's tokenizer differs from the target's ({len(draft_vocab)} vs {len(target_vocab)} "
        f"tokens; e.g. only in one: {differ}, other ids: {moved}): a draft_model drafter needs the target's tokenizer"
    )


class DraftModelDrafter:
    """A Hugging Face causal LM as the drafter; see the module docstring."""

    name = "draft_model"
    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, model: nn.Module | TargetModel, target: TargetModel | None = None):
        """`model`: the draft (a causal LM, or a `TargetModel` wrapping one — the target itself is a valid,
        if slow, draft). `target`: checked to share the draft's vocabulary size when given."""
        module = model.model if isinstance(model, TargetModel) else model
        self.model = TargetModel(module, layer_ids=())  # its own wrapper: no hidden states, its own caches
        if target is not None:
            check_vocab_size(self.model.vocab_size, target.vocab_size)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def start(self, num_slots: int, capacity: int) -> KVSlots:
        return self.model.new_cache(num_slots, capacity)

    def reset(self, state: KVSlots, rows: Tensor) -> None:
        state.lengths[rows.to(state.lengths.device)] = 0

    @torch.no_grad()
    def observe(self, state: KVSlots, rows: Tensor, token_ids: Tensor, features: Tensor, num_new: Tensor) -> None:
        """Run the draft over the newly committed positions (features are ignored), appending their keys and
        values to each row's slot."""
        device = self.device
        rows, token_ids, num_new = rows.to(device), token_ids.to(device), num_new.to(device)
        has_new = num_new > 0
        if not bool(has_new.any()):
            return
        rows, token_ids, num_new = rows[has_new], token_ids[has_new], num_new[has_new]
        last = torch.zeros(len(rows), 1, dtype=torch.long, device=device)  # logits are not needed: keep one
        self.model.forward(state, rows, token_ids, num_new, logits_at=last)

    @torch.no_grad()
    def propose(self, state: KVSlots, step: DraftStep) -> DraftProposal:
        device, out_device = self.device, step.token_ids.device
        rows, n = step.rows.to(device), step.num_drafts
        committed = step.anchor_positions.to(device)
        if bool((state.lengths[rows] != committed).any()):
            raise RuntimeError("draft model cache out of step with the committed tokens: observe() was missed")
        temperatures = step.temperatures.to(device)
        num_valid = (state.capacity - committed).clamp(min=0, max=n)  # one slot per forward
        greedy = bool(is_greedy(temperatures).all())
        uniforms = draw_uniforms(step.generators, n, device)
        try:
            tokens, probs = self._draft(state, rows, step.anchor_ids.to(device), num_valid, n, temperatures,
                                        uniforms, greedy)
        finally:
            state.rollback(rows, committed)  # drafts are not committed: verification decides
        return DraftProposal(
            token_ids=tokens.to(out_device),
            draft_probs=None if probs is None else probs.to(out_device),
            confidence_logits=None,
            num_valid=None if bool((num_valid == n).all()) else num_valid.to(out_device),
        )

    def _draft(
        self, state: KVSlots, rows: Tensor, anchors: Tensor, num_valid: Tensor, n: int, temperatures: Tensor,
        uniforms: Tensor, greedy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """γ sequential one-token forwards from the anchors → tokens [R, γ] and draft probs [R, γ, V] (None
        when every row is greedy). Position k of a row with num_valid ≤ k gets token 0 with a one-hot law:
        never verified."""
        tokens = torch.zeros(len(rows), n, dtype=torch.long, device=self.device)
        probs = None if greedy else torch.zeros(len(rows), n, self.model.vocab_size, device=self.device)
        token = anchors
        for k in range(n):
            active = num_valid > k
            if not bool(active.any()):
                break
            out = self.model.forward(state, rows, token[:, None], active.long())
            logits = out.logits[:, 0]  # [R, V]
            token, p = draw_position(logits, temperatures, uniforms[:, k], greedy)
            if probs is not None and p is not None:
                probs[:, k] = p
            token = torch.where(active, token, torch.zeros_like(token))
            tokens[:, k] = token
        if probs is not None:
            idle = torch.arange(n, device=self.device)[None, :] >= num_valid[:, None]  # [R, γ] no forward ran
            probs[idle] = _one_hot_zero(probs[idle])
        return tokens, probs


def _one_hot_zero(like: Tensor) -> Tensor:
    """A one-hot law on token 0, shaped like `like` [..., V]: the placeholder of a position not drafted."""
    out = torch.zeros_like(like)
    out[..., 0] = 1.0
    return out


def load_draft_model(
    location: str | Path,
    *,
    target: TargetModel | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    target_tokenizer: Any = None,
) -> DraftModelDrafter:
    """Load a Hugging Face causal LM (local directory or hub id) as a `DraftModelDrafter`, on the target's
    device and dtype unless told otherwise. With `target_tokenizer`, the draft's own tokenizer (when its
    directory has one) must map every token to the same id."""
    from dspark_core.random_init import load_causal_lm

    dtype = dtype or (target.dtype if target is not None else torch.float32)
    device = device or (target.device if target is not None else "cpu")
    model = load_causal_lm(location, dtype, device)  # a random-weight directory is built, not loaded
    drafter = DraftModelDrafter(model, target=target)
    if target_tokenizer is not None:
        draft_tokenizer = _tokenizer_of(location)
        if draft_tokenizer is not None:
            check_tokenizers(draft_tokenizer, target_tokenizer)
    return drafter


def _tokenizer_of(location: str | Path) -> Any:
    """The tokenizer saved with a model, or None when its directory has none (a bare save_pretrained)."""
    from transformers import AutoTokenizer

    path = Path(str(location))
    if path.is_dir() and not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                                                 "vocab.json", "tokenizer.model")):
        return None
    return AutoTokenizer.from_pretrained(str(location))
