"""The embedded target's tokenizer: a small byte-level BPE trained here, and a ChatML chat template.

Byte-level BPE (GPT-2/Qwen style) needs no `<unk>`: every string round-trips through the 256 byte
symbols, so the tokenizer never fails on code, maths or odd Unicode. The pre-tokenizer is Qwen2/Qwen3's
regex (digits split one by one, which helps a tiny model with arithmetic; runs of spaces kept apart
from the next word, which keeps Python indentation cheap). Training is deterministic for a given list
of texts (the BPE trainer breaks ties by pair, not by hash order), so the same corpus gives the same
`tokenizer.json` byte for byte.

Special tokens take ids 0…3, in this order:

- `<|endoftext|>`: end of a document; eos and pad. Packed training rows separate examples with it.
- `<|im_start|>`, `<|im_end|>`: ChatML turn markers, as in Qwen. The model ends an answer with
  `<|im_end|>\\n<|endoftext|>`, so a client that stops at either token gets the same answer.
- `<|mask|>`: the DSpark/DFlash draft block's mask token (block slots 1 … γ−1). It never occurs in the
  training text, so its embedding stays at initialisation; drafts learn what to do with it.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS_TOKEN, IM_START, IM_END, MASK_TOKEN)

# Qwen2/Qwen3's pre-tokenizer pattern, verbatim.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML like Qwen2.5/Qwen3, without a default system prompt, tools or <think> handling. `render_chat`
# below is its Python twin (tests check they agree); training text is rendered by the twin, which also
# says where the assistant spans are.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

Turn = tuple[str, "str | None"]  # (user, assistant); assistant None only in the last turn of a prompt


def render_chat(turns: Sequence[Turn], add_generation_prompt: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """Render user/assistant turns exactly as `CHAT_TEMPLATE` does.

    Returns the text and the character spans `[start, end)` of each assistant reply *including* its
    closing `<|im_end|>\\n`, i.e. everything the model must learn to produce. A last turn with assistant
    `None` and `add_generation_prompt=True` renders a prompt (`…<|im_start|>assistant\\n`).
    """
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    for user, assistant in turns:
        for role, content in (("user", user), ("assistant", assistant)):
            if role == "assistant" and assistant is None:
                break
            head = f"{IM_START}{role}\n"
            body = f"{content}{IM_END}\n"
            parts += [head, body]
            if role == "assistant":
                spans.append((pos + len(head), pos + len(head) + len(body)))
            pos += len(head) + len(body)
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts), spans


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE with `vocab_size` entries in all (256 bytes + specials + merges)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        max_token_length=16,  # no 40-character `=====` or docstring-indent tokens
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(name) == i, f"special token {name} must have id {i}"
    return tok


def to_hf_tokenizer(tok: Tokenizer):
    """Wrap a trained `tokenizers.Tokenizer` as a transformers fast tokenizer with the chat template.

    `eos_token`/`pad_token` are `<|endoftext|>`; `mask_token` is `<|mask|>`. No BOS is prepended
    (Qwen convention): a prompt starts directly with `<|im_start|>`.
    """
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf
