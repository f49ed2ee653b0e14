"""From a task sample to prompt token ids, the way DeepSpec-style evaluations build them: user turns only,
no system prompt, each user turn passed through the task's `prompt_template`, then the tokenizer's own chat
template with the generation prompt appended.

Multi-turn (MT-Bench): the runner renders turn 1, generates, then renders again with `answers=[turn-1
answer]`, which yields user 1, assistant answer 1, user 2 — the second question follows the model's own
first answer.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from inputs.tasks.spec import TaskSample, TaskSpec

Message = dict[str, str]


def render_messages(spec: TaskSpec, sample: TaskSample, answers: Sequence[str] = ()) -> list[Message]:
    """Chat messages for the next user turn: turns 1..len(answers)+1, with the model's earlier answers."""
    num_turns = min(spec.turns, len(sample.turns))
    if len(answers) >= num_turns:
        raise ValueError(f"sample {sample.id!r} of task {spec.name!r} has {num_turns} turn(s); "
                         f"got {len(answers)} answer(s), so there is no next user turn")
    messages: list[Message] = []
    for i in range(len(answers) + 1):
        messages.append({"role": "user", "content": spec.format_prompt(sample.turns[i])})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def tokenize_messages(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Prompt ids through the tokenizer's chat template, generation prompt appended. Works with any Hugging
    Face tokenizer that has a `chat_template` (transformers 4.x returns ids, 5.x a BatchEncoding)."""
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(f"tokenizer {name!r} has no chat_template; use an instruct/chat model's tokenizer "
                         "or set tokenizer.chat_template")
    out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], (list, tuple)):  # a batch of one
        (out,) = out
    return [int(t) for t in out]


def prompt_ids(tokenizer: Any, spec: TaskSpec, sample: TaskSample, answers: Sequence[str] = ()) -> list[int]:
    """`tokenize_messages(tokenizer, render_messages(spec, sample, answers))`."""
    return tokenize_messages(tokenizer, render_messages(spec, sample, answers))


def stop_tokens(tokenizer: Any) -> tuple[int, ...]:
    """End of an answer: eos and ChatML's `<|im_end|>` where the tokenizer has it."""
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return tuple(sorted(i for i in ids if i is not None and i >= 0 and i != tokenizer.unk_token_id))
