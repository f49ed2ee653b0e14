"""Reusable training fixtures: a tiny target that has learnt a toy language, its target cache, drafts.

An untrained random target writes near-random text that no draft can learn, so the target here is
first trained for a few seconds on a synthetic "word" language: 10 words of 3–5 tokens, each word
followed by one of three successors with probabilities 0.6 / 0.3 / 0.1. Inside a word the next token
is certain given the word's start (which needs context, not just the previous token); at a word
boundary the continuation is multi-modal, the case where parallel drafting (DFlash) collides and a
sequential head (DSpark) helps.

Everything is cached per process (`functools.cache`), so tests in several files share one target:

    from fixtures_training import toy_target, toy_cache, new_draft, acceptance_length
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch

from dspark_core.drafters import as_drafter, build_draft_model, draft_config_for
from dspark_core.generate import GenerationConfig, generate
from dspark_core.target import TargetModel
from dspark_core.target_cache import TargetCache, build_target_cache

VOCAB_SIZE = 48
MASK_TOKEN_ID = VOCAB_SIZE - 1  # never in the language
NUM_WORDS = 10
TARGET_LAYER_IDS = (0, 1, 2)  # of a 4-layer target (the last one is never a feature)
SUCCESSOR_PROBS = (0.6, 0.3, 0.1)


@contextlib.contextmanager
def single_thread():
    """One intra-op thread: these models are tiny, and with 2 shared cores a second thread mostly
    waits (10× slower steps were measured while other test runs shared the machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@functools.cache
def toy_language(seed: int = 0) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(words, successors): word w is a token tuple with a unique first token; successors[w] its 3 next words."""
    g = torch.Generator().manual_seed(seed)
    firsts = (torch.randperm(VOCAB_SIZE - 2, generator=g)[:NUM_WORDS] + 1).tolist()
    words = []
    for first in firsts:
        length = int(torch.randint(3, 6, (1,), generator=g))
        words.append((first, *(torch.randint(1, VOCAB_SIZE - 1, (length - 1,), generator=g).tolist())))
    successors = tuple(tuple(torch.randperm(NUM_WORDS, generator=g)[:3].tolist()) for _ in range(NUM_WORDS))
    return tuple(words), successors


def sample_text(num_tokens: int, generator: torch.Generator, seed: int = 0) -> list[int]:
    """A sequence of whole words (cut to num_tokens), starting at a random word."""
    words, successors = toy_language(seed)
    w = int(torch.randint(NUM_WORDS, (1,), generator=generator))
    out: list[int] = []
    probs = torch.tensor(SUCCESSOR_PROBS)
    while len(out) < num_tokens:
        out += words[w]
        w = successors[w][int(torch.multinomial(probs, 1, generator=generator))]
    return out[:num_tokens]


def sample_prompts(num: int, seed: int, min_len: int = 6, max_len: int = 14) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [sample_text(int(torch.randint(min_len, max_len + 1, (1,), generator=g)), g) for _ in range(num)]


@functools.cache
def toy_target(steps: int = 120, seed: int = 0) -> TargetModel:
    """A 4-layer Qwen3 (V=48, hidden 64) trained on the toy language: ≈ 3–4 s on one idle core
    (final per-token CE ≈ 0.22 nats, close to the language's own entropy)."""
    with single_thread():
        return _train_toy_target(steps, seed)


def _train_toy_target(steps: int, seed: int) -> TargetModel:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(  # shaped like tests/conftest.py's tiny_qwen3, a bit wider
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        batch = torch.tensor([sample_text(33, g) for _ in range(16)])  # [16, 33]
        for group in opt.param_groups:  # 20-step warm-up, then linear decay to 10%
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * (1 - step / steps))
        logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB_SIZE), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    target = TargetModel(model, TARGET_LAYER_IDS)
    target.train_seconds = time.perf_counter() - start  # type: ignore[attr-defined]
    target.train_loss = float(loss.detach())  # type: ignore[attr-defined]
    return target


@functools.cache
def toy_cache(num_prompts: int = 96, max_new_tokens: int = 40, temperature: float = 1.0, seed: int = 0) -> TargetCache:
    """The toy target's own answers (T=1, seeded) to toy prompts, with features and logits."""
    target = toy_target()
    with single_thread():
        return build_target_cache(
            target, sample_prompts(num_prompts, seed=1000 + seed), layer_ids=TARGET_LAYER_IDS,
            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        )


def eval_prompts(num: int = 16) -> list[list[int]]:
    """Held out from the cache's prompts (another seed)."""
    return sample_prompts(num, seed=99_999)


def new_draft(method: str, head: str = "markov", *, confidence_head: bool | None = None, seed: int = 0,
              num_layers: int | None = None, draft_vocabulary: torch.Tensor | None = None):
    """An untrained draft for the toy target, embeddings copied and frozen (the caller's job); over
    `draft_vocabulary` (target ids) only, when given."""
    target = toy_target()
    config = draft_config_for(
        target, method, mask_token_id=MASK_TOKEN_ID, head=head, num_layers=num_layers or (1 if method == "eagle3" else 2),
        markov_rank=32, confidence_head=confidence_head, block_size=7, target_layer_ids=TARGET_LAYER_IDS,
        draft_vocab_size=None if draft_vocabulary is None else len(draft_vocabulary),
    )
    torch.manual_seed(seed)
    model = build_draft_model(config)
    if draft_vocabulary is not None:
        model.set_draft_vocabulary(draft_vocabulary)
    model.copy_target_embeddings(target.input_embeddings(), target.output_embeddings())
    return model


def acceptance_length(model, temperature: float, *, num_prompts: int = 16, max_new_tokens: int = 48,
                      num_drafts: int = 7, seed: int = 0) -> float:
    """τ = tokens emitted per verification step (accepted drafts + the bonus/correction token)."""
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, num_drafts=num_drafts, temperature=temperature)
    target = toy_target()
    with single_thread():
        results = generate(target, as_drafter(model), eval_prompts(num_prompts), cfg, seed=seed)
    steps = sum(r.counters.num_steps for r in results)
    emitted = sum(sum(r.counters.num_accepted) + r.counters.num_steps for r in results)
    return emitted / steps
