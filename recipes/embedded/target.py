"""The embedded target: a few-million-parameter Qwen3 trained here, on CPU, in minutes.

It exists so that `harness run suites/cpu.yaml` measures real speculative decoding (a target with
structure for drafts to learn) on any machine with no network. The output is an ordinary Hugging Face
directory (Qwen3 architecture, so vLLM's `Qwen3DSparkModel` drafts can later sit on it):
`config.json`, `model.safetensors`, `generation_config.json`, the tokenizer files with a ChatML chat
template, and `training_report.json`.

Choices, and why:

- **Loss on assistant tokens only** (each reply, its `<|im_end|>\\n` and the `<|endoftext|>` after the
  example). The harness only ever asks the target to answer; modelling the prompts (GSM8K questions,
  docstrings that the answer repeats anyway, "Explain …" lines) would spend a tiny model's capacity on
  text it never generates, and would teach it to write user turns after its answer.
- **Packing by concatenation**: examples (each followed by `<|endoftext|>`) are shuffled, concatenated
  and cut into rows of `seq_len` tokens, so no compute goes to padding. Attention crosses example
  boundaries, as in GPT-2/nanoGPT; the separator tells the model where an example ends.
- **Untied embeddings** (`tie_word_embeddings=False`, as Qwen3-8B): `model.embed_tokens.weight` and
  `lm_head.weight` are both in the safetensors, which is what DSpark drafts copy and freeze.
- **fp32** throughout (no bf16 autocast on CPU), `torch.set_num_threads(2)` by default.
- **Deterministic**: the seed fixes initialisation and data order; the corpus and tokenizer are
  seed-free. `max_minutes` guards the wall-clock budget: the cosine schedule runs on
  `progress = max(step / max_steps, elapsed / budget)`, so on a machine fast enough to finish the
  planned steps the run is exactly reproducible, and on a slower one it anneals early and ends on time
  (the report says `time_limited: true`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from recipes.embedded.corpus import CODE_INSTRUCTION, DOMAINS, MATH_INSTRUCTION, ChatExample, CorpusCaps, build_corpus
from recipes.embedded.tokenizer import (EOS_TOKEN, IM_END, IM_START, MASK_TOKEN, render_chat, to_hf_tokenizer,
                                        train_tokenizer)

REPORT_FILE = "training_report.json"
REPORT_VERSION = 1


@dataclass(frozen=True)
class TargetPreset:
    """Model shape, data caps and optimiser settings of one build."""

    name: str
    # Qwen3 shape
    vocab_size: int = 4096  # including the 4 special tokens
    hidden_size: int = 128
    num_layers: int = 5  # ≥ 4, so drafts can read several layers (default ids 1, 2)
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32  # a size every vLLM attention backend supports
    intermediate_size: int = 384
    max_position_embeddings: int = 4096  # RoPE table; quality is only trained up to seq_len
    # data
    caps: CorpusCaps = CorpusCaps()
    seq_len: int = 512  # covers a GSM8K answer or a HumanEval prompt + completion in one window
    batch_size: int = 4  # 2,048 tokens a step: compute-bound, so more, smaller steps learn faster
    # optimiser: AdamW, linear warm-up then cosine to min_lr
    max_steps: int = 1800
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_frac: float = 0.04
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    max_minutes: float = 12.0  # training-loop budget; see the module docstring
    # Train on every token, not only the replies (validation is replies only). Measured: 0.1–0.2 nats
    # lower reply loss at equal compute early on, but the model starts echoing prompt lines in answers.
    loss_on_prompts: bool = False
    eval_batch_size: int = 16
    log_every: int = 25
    sample_tokens: int = 96  # greedy tokens per SAMPLE_PROMPTS answer in the report (0: none)


PRESETS: dict[str, TargetPreset] = {
    # ≈ 2 M parameters (half of them the embeddings and LM head). The build is compute-bound, and at
    # this budget a narrower model that sees more tokens wins: in equal 2.5-minute runs hidden 128 reached
    # a validation loss 0.4–0.6 nats lower than hidden 192 (3.97 M). Measured ≈ 5,600 tokens/s on 2 free
    # cores, so the 1,800 steps (3.7 M tokens, ≈ 4 epochs) take ≈ 11 minutes; slower machines see fewer
    # tokens (the schedule anneals on time) and their report says `time_limited`.
    "default": TargetPreset(name="default"),
    # CI: the same model on a quarter of the data, 250 short steps; 1–2 minutes.
    "reduced": TargetPreset(
        name="reduced", caps=CorpusCaps(250_000, 250_000, 250_000, num_val=24),
        seq_len=256, batch_size=8, max_steps=250, max_minutes=2.0,
    ),
}

# Built-in prompts for a smoke generation per domain, recorded in the report.
SAMPLE_PROMPTS: dict[str, str] = {
    "math": "Tom has 3 boxes with 12 apples in each box. He gives away 10 apples. "
            f"How many apples does he have left?\n{MATH_INSTRUCTION}",
    "code": f'{CODE_INSTRUCTION}\ndef count_vowels(text):\n    """Return the number of vowels in text."""\n',
    "chat": "Explain what a Python list is.",
}


@dataclass
class TrainingReport:
    """What `training_report.json` holds. Losses are mean cross-entropy (nats) per assistant token."""

    preset: str
    seed: int
    num_params: int
    num_steps: int
    tokens_seen: int  # rows × seq_len over all steps (every position is a forward/backward)
    loss_tokens_seen: int  # of those, assistant tokens that carried loss
    train_seconds: float  # the training loop
    wall_seconds: float  # corpus + tokenizer + training + evaluation + saving
    time_limited: bool
    val_loss_init: dict[str, float]
    val_loss: dict[str, float]
    final_train_loss: float
    corpus: dict[str, dict[str, int]]  # per domain: examples and characters (train), tokens (train)
    corpus_fingerprint: str
    config: dict
    samples: dict[str, str] = field(default_factory=dict)  # greedy answers to SAMPLE_PROMPTS
    num_threads: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    report_version: int = REPORT_VERSION


# ---- tokenised data ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizedExample:
    ids: np.ndarray  # [n] int64, ends with <|endoftext|>
    loss_mask: np.ndarray  # [n] bool, True where the token is one the model must produce


def tokenize_examples(tok, examples: Sequence[ChatExample]) -> list[TokenizedExample]:
    """Render through the chat template, tokenize, and mark assistant tokens (by character offsets)."""
    rendered = [render_chat(ex.turns) for ex in examples]
    encodings = tok.encode_batch([text for text, _ in rendered])
    eos_id = tok.token_to_id(EOS_TOKEN)
    out = []
    for (_, spans), enc in zip(rendered, encodings):
        starts = np.array([s for s, _ in enc.offsets], dtype=np.int64)
        mask = np.zeros(len(starts), dtype=bool)
        for lo, hi in spans:
            mask |= (starts >= lo) & (starts < hi)
        out.append(TokenizedExample(
            ids=np.array(enc.ids + [eos_id], dtype=np.int64), loss_mask=np.append(mask, True),
        ))
    return out


def packed_rows(examples: Sequence[TokenizedExample], seq_len: int, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """One epoch: shuffle examples (seeded), concatenate, cut into rows of seq_len + 1 tokens.

    Returns ids and loss mask, both [num_rows, seq_len + 1]; row r's inputs are [:-1], targets [1:].
    The tail that does not fill a row is dropped (it differs each epoch, so nothing is lost for good).
    """
    order = list(range(len(examples)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    ids = np.concatenate([examples[i].ids for i in order])
    mask = np.concatenate([examples[i].loss_mask for i in order])
    num_rows = (len(ids) - 1) // seq_len
    # Rows overlap by one token so every position is a target exactly once.
    idx = np.arange(num_rows)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return ids[idx], mask[idx]


def batches(examples: Sequence[TokenizedExample], seq_len: int, batch_size: int, seed: int, all_tokens: bool = False):
    """Endless (inputs, targets) batches; targets are -100 where no loss applies (unless all_tokens)."""
    epoch = 0
    while True:
        ids, mask = packed_rows(examples, seq_len, seed, epoch)
        if all_tokens:
            mask = np.ones_like(mask)
        for b in range(0, len(ids) - batch_size + 1, batch_size):
            x = torch.from_numpy(ids[b : b + batch_size, :-1])
            y = torch.from_numpy(np.where(mask[b : b + batch_size, 1:], ids[b : b + batch_size, 1:], -100))
            yield x, y
        epoch += 1


@torch.no_grad()
def evaluate(model, examples: Sequence[TokenizedExample], seq_len: int, batch_size: int) -> float:
    """Mean loss per assistant token over whole examples (not packed), each cut to seq_len + 1 tokens."""
    model.eval()
    total, count = 0.0, 0
    for b in range(0, len(examples), batch_size):
        chunk = examples[b : b + batch_size]
        width = min(seq_len + 1, max(len(e.ids) for e in chunk))
        ids = torch.zeros(len(chunk), width, dtype=torch.long)  # right-padded; padding is never a target
        targets = torch.full((len(chunk), width), -100, dtype=torch.long)
        for r, e in enumerate(chunk):
            n = min(width, len(e.ids))
            ids[r, :n] = torch.from_numpy(e.ids[:n])
            targets[r, :n] = torch.from_numpy(np.where(e.loss_mask[:n], e.ids[:n], -100))
        logits = model(input_ids=ids[:, :-1]).logits  # [rows, width - 1, vocab]
        y = targets[:, 1:]
        total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum"))
        count += int((y != -100).sum())
    model.train()
    return total / max(count, 1)


# ---- model ------------------------------------------------------------------------------------------


def qwen3_config(preset: TargetPreset, tok):
    """A standard `Qwen3Config`; `mask_token_id` is an extra key drafts (and vLLM's DSpark) can read."""
    from transformers import Qwen3Config

    eos_id, mask_id = tok.token_to_id(EOS_TOKEN), tok.token_to_id(MASK_TOKEN)
    cfg = Qwen3Config(
        vocab_size=tok.get_vocab_size(), hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size, num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads, num_key_value_heads=preset.num_kv_heads,
        head_dim=preset.head_dim, max_position_embeddings=preset.max_position_embeddings,
        tie_word_embeddings=False, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
        architectures=["Qwen3ForCausalLM"],
    )
    cfg.mask_token_id = mask_id
    return cfg


def lr_at(preset: TargetPreset, progress: float) -> float:
    """Linear warm-up over warmup_frac, then cosine from lr down to min_lr at progress 1."""
    if progress < preset.warmup_frac:
        return preset.lr * progress / preset.warmup_frac
    t = min(1.0, (progress - preset.warmup_frac) / (1.0 - preset.warmup_frac))
    return preset.min_lr + 0.5 * (preset.lr - preset.min_lr) * (1.0 + math.cos(math.pi * t))


def _optimizer(model, preset: TargetPreset) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # RMSNorm gains
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": preset.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=preset.lr, betas=preset.betas,
    )


@torch.no_grad()
def greedy_answer(model, hf_tok, prompt: str, max_new_tokens: int = 96) -> str:
    """One user turn through the chat template, greedy decoding, the reply decoded without specials."""
    ids = hf_tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return hf_tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


# ---- the build --------------------------------------------------------------------------------------


def train_target(
    out_dir: str | os.PathLike,
    *,
    data_dir: str | os.PathLike | None = None,
    seed: int = 0,
    preset: str | TargetPreset = "default",
    max_minutes: float | None = None,
    num_threads: int = 2,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> TrainingReport:
    """Build the corpus and tokenizer, train the target, and write the Hugging Face directory.

    `data_dir` (or `$HARNESS_DATA_DIR`) holds `gsm8k/train.jsonl`. `preset` is a name in `PRESETS` or a
    `TargetPreset` (tests pass a tiny one). `max_minutes` overrides the preset's training budget. The
    directory is written beside `out_dir` and renamed into place at the end, so a directory that exists
    is complete; an existing `out_dir` is an error unless `overwrite`.
    """
    from transformers import GenerationConfig, Qwen3ForCausalLM

    wall_start = time.perf_counter()
    p = PRESETS[preset] if isinstance(preset, str) else preset
    if max_minutes is not None:
        p = replace(p, max_minutes=max_minutes)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty (pass overwrite=True to replace it)")
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        corpus = build_corpus(data_dir, p.caps)
        log(f"corpus {corpus.fingerprint()[:12]}: {corpus.stats()}")
        tok = train_tokenizer((f"{u}\n{a}" for ex in corpus.train for u, a in ex.turns), p.vocab_size)
        train_data = tokenize_examples(tok, corpus.train)
        val_data = {d: tokenize_examples(tok, corpus.val[d]) for d in DOMAINS}
        stats = corpus.stats()
        for d in DOMAINS:
            stats[d]["train_tokens"] = int(sum(len(t.ids) for t, e in zip(train_data, corpus.train) if e.domain == d))
        log(f"tokenizer: {tok.get_vocab_size()} tokens; train tokens per domain "
            f"{ {d: stats[d]['train_tokens'] for d in DOMAINS} }")

        torch.manual_seed(seed)
        cfg = qwen3_config(p, tok)
        cfg._attn_implementation = "sdpa"
        model = Qwen3ForCausalLM(cfg).float()
        model.train()
        num_params = sum(t.numel() for t in model.parameters())
        val_init = {d: evaluate(model, val_data[d], p.seq_len, p.eval_batch_size) for d in DOMAINS}
        log(f"{num_params / 1e6:.2f} M parameters; initial validation loss {_fmt(val_init)}")

        opt = _optimizer(model, p)
        budget = p.max_minutes * 60.0
        train_start = time.perf_counter()
        step, tokens, loss_tokens, smooth, time_limited = 0, 0, 0, float("nan"), False
        for x, y in batches(train_data, p.seq_len, p.batch_size, seed, p.loss_on_prompts):
            elapsed = time.perf_counter() - train_start
            progress = max(step / p.max_steps, elapsed / budget)
            if progress >= 1.0:
                time_limited = step < p.max_steps
                break
            for group in opt.param_groups:
                group["lr"] = lr_at(p, progress)
            logits = model(input_ids=x).logits  # [batch, seq_len, vocab]
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip)
            opt.step()
            step += 1
            tokens += x.numel()
            loss_tokens += int((y != -100).sum())
            loss_value = loss.item()
            smooth = loss_value if math.isnan(smooth) else 0.9 * smooth + 0.1 * loss_value
            if step % p.log_every == 0:
                rate = tokens / (time.perf_counter() - train_start)
                log(f"step {step}/{p.max_steps} loss {smooth:.3f} lr {opt.param_groups[0]['lr']:.2e} "
                    f"{rate:.0f} tok/s")
        train_seconds = time.perf_counter() - train_start

        model.eval()
        val = {d: evaluate(model, val_data[d], p.seq_len, p.eval_batch_size) for d in DOMAINS}
        log(f"{step} steps, {tokens} tokens in {train_seconds:.0f} s; validation loss {_fmt(val)}")

        hf_tok = to_hf_tokenizer(tok)
        eos_id, im_end_id = tok.token_to_id(EOS_TOKEN), tok.token_to_id(IM_END)
        # Stop at the end of the reply (<|im_end|>) or of the document (<|endoftext|>), as Qwen3 does.
        model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=[im_end_id, eos_id],
                                                   pad_token_id=eos_id)
        samples = {d: greedy_answer(model, hf_tok, prompt, p.sample_tokens)
                   for d, prompt in SAMPLE_PROMPTS.items() if p.sample_tokens > 0}

        report = TrainingReport(
            preset=p.name, seed=seed, num_params=num_params, num_steps=step, tokens_seen=tokens,
            loss_tokens_seen=loss_tokens, train_seconds=round(train_seconds, 1), wall_seconds=0.0,
            time_limited=time_limited, val_loss_init=_round(val_init), val_loss=_round(val),
            final_train_loss=round(smooth, 4), corpus=stats, corpus_fingerprint=corpus.fingerprint(),
            config=asdict(p), samples=samples, num_threads=num_threads, versions=_versions(),
        )
        _save(out, model, hf_tok, report, wall_start, overwrite)
        log(f"wrote {out} in {report.wall_seconds:.0f} s")
        return report
    finally:
        torch.set_num_threads(prev_threads)


def _save(out: Path, model, hf_tok, report: TrainingReport, wall_start: float, overwrite: bool) -> None:
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    hf_tok.save_pretrained(tmp)
    _portable_tokenizer_files(tmp, hf_tok)
    report.wall_seconds = round(time.perf_counter() - wall_start, 1)
    (tmp / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    if out.exists():
        if not overwrite and any(out.iterdir()):
            raise FileExistsError(f"{out} appeared while training")
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)


def _portable_tokenizer_files(directory: Path, hf_tok) -> None:
    """transformers 5 writes `tokenizer_class: TokenizersBackend` and no special_tokens_map.json, which
    transformers 4.x (still behind some vLLM builds) cannot read; name the class both versions know and
    write the map too. transformers 5 loads the result unchanged."""
    path = directory / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["additional_special_tokens"] = [IM_START, IM_END]
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    special = {"eos_token": hf_tok.eos_token, "pad_token": hf_tok.pad_token, "mask_token": hf_tok.mask_token,
               "additional_special_tokens": [IM_START, IM_END]}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def load_report(model_dir: str | os.PathLike) -> dict:
    return json.loads((Path(model_dir) / REPORT_FILE).read_text())


def _fmt(losses: dict[str, float]) -> str:
    return ", ".join(f"{d} {v:.3f}" for d, v in losses.items())


def _round(losses: dict[str, float]) -> dict[str, float]:
    return {d: round(v, 4) for d, v in losses.items()}


def _versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train the embedded target (a tiny Qwen3) on CPU.")
    parser.add_argument("out_dir")
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS))
    parser.add_argument("--data-dir", default=None, help="folder with gsm8k/ (default: $HARNESS_DATA_DIR)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    train_target(args.out_dir, data_dir=args.data_dir, seed=args.seed, preset=args.preset,
                 max_minutes=args.max_minutes, num_threads=args.threads, overwrite=args.overwrite,
                 log=lambda m: print(m, flush=True))


if __name__ == "__main__":
    main()
