"""An OpenAI request body → an engine `Request`, or a `BadRequest` that names the field.

Every field the server reads is checked for its type and range here, before anything reaches the engine:
a wrong type or value is a 4xx with the OpenAI error body (`responses.error_body`), never a 500, a hang
or a closed connection. Fields the engine cannot honour are refused rather than ignored (n > 1, best_of,
echo, top_p ≠ 1, penalties, string `stop`); unknown fields are ignored, as vLLM does.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

from backends.inhouse.engine import Request

MAX_TEMPERATURE = 100.0  # finite and bounded: above this, sampling is uniform for any practical logits
MAX_TOP_LOGPROBS = 20
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_NESTING = 64  # a body nested deeper is not an OpenAI request (and would exhaust the parser's stack)


class BadRequest(Exception):
    """A request the server refuses: `status` (4xx; 5xx for the server's own trouble), the field (`param`)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str | None = None):
        super().__init__(message)
        self.param, self.status = param, status
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")


@dataclass(frozen=True)
class ModelContext:
    """What validation needs to know about the served model."""

    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    model_name: str
    max_context: int

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)


def parse_body(data: bytes) -> dict:
    """The body as a JSON object; NaN/Infinity are refused where they appear (`finite_numbers`)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not UTF-8 (byte {exc.start})") from None
    try:
        body = json.loads(text) if text.strip() else None
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    finite_numbers(body)
    return body


def finite_numbers(body: dict) -> None:
    """Refuse NaN and ±Infinity anywhere in the body (JSON has neither; Python's parser accepts both), and
    bodies nested deeper than an OpenAI request ever is. Iterative: a deep body cannot exhaust the stack."""
    todo: list[tuple[Any, str, int]] = [(body, "", 0)]
    while todo:
        value, path, depth = todo.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise BadRequest(f"{path} must be a finite number, got {value!r}", path)
        if isinstance(value, (dict, list)) and depth >= MAX_NESTING:
            raise BadRequest(f"the body is nested deeper than {MAX_NESTING} levels", path.split(".")[0].split("[")[0])
        if isinstance(value, dict):
            todo += [(item, f"{path}.{key}" if path else str(key), depth + 1) for key, item in value.items()]
        elif isinstance(value, list):
            todo += [(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _optional(body: dict, key: str, kind: type | tuple, what: str) -> Any:
    value = body.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        raise BadRequest(f"{key} must be {what}, got {_shown(value)}", key)
    return value


def prompt_ids(ctx: ModelContext, body: dict, chat: bool) -> list[int]:
    if chat:
        return _chat_ids(ctx, body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = list(ctx.tokenizer.encode(prompt))
        if not ids:
            raise BadRequest("prompt is empty (no tokens)", "prompt")
        return ids
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if any(not 0 <= t < ctx.vocab_size for t in prompt):
            raise BadRequest(f"token ids must lie in [0, {ctx.vocab_size})", "prompt")
        return list(prompt)
    if prompt is None:
        raise BadRequest("prompt is required (a string or a list of token ids)", "prompt")
    raise BadRequest("prompt must be a non-empty string or a non-empty list of token ids (one prompt per request)",
                     "prompt")


def _chat_ids(ctx: ModelContext, body: dict) -> list[int]:
    from inputs.tasks import tokenize_messages

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects", "messages")
    flat = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where} must be an object with role and content", where)
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"{where}.role must be one of {', '.join(ROLES)}, got {_shown(role)}", f"{where}.role")
        flat.append({"role": role, "content": _content(m.get("content"), f"{where}.content")})
    try:
        ids = tokenize_messages(ctx.tokenizer, flat)
    except ValueError as exc:  # no chat template
        raise BadRequest(str(exc), "messages") from None
    if not ids:
        raise BadRequest("messages render to an empty prompt", "messages")
    return ids


def _content(content: Any, where: str) -> str:
    """Text content: a string, null, or a list of text parts ({"type": "text", "text": ...})."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of text parts, got {_shown(content)}", where)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise BadRequest(f"{where}[{j}] must be a text part {{\"type\": \"text\", \"text\": \"...\"}}; "
                             "this server reads text only", f"{where}[{j}]")
        texts.append(part["text"])
    return "".join(texts)


@dataclass(frozen=True)
class ParsedRequest:
    """A validated request: the engine's part and how to answer."""

    request: Request
    stream: bool
    include_usage: bool
    logprobs: bool


def build_request(ctx: ModelContext, body: dict, chat: bool, request_id: str) -> ParsedRequest:
    """Validate an OpenAI body and build the engine request (BadRequest says what is wrong)."""
    model = body.get("model")
    if model is not None and model != ctx.model_name:
        raise BadRequest(f"the model {_shown(model)} does not exist; this server serves {ctx.model_name!r}", "model",
                         404, "not_found_error")
    for key, ok in (("n", 1), ("best_of", 1), ("echo", False), ("top_p", 1), ("frequency_penalty", 0),
                    ("presence_penalty", 0)):
        if key in body and body[key] is not None and (body[key] != ok or isinstance(body[key], bool) != isinstance(ok, bool)):
            raise BadRequest(f"{key}={_shown(body[key])} is not supported (only {ok!r})", key)
    if body.get("stop"):
        raise BadRequest("string stop sequences are not supported; use stop_token_ids", "stop")
    stream = bool(_optional(body, "stream", bool, "true or false"))
    options = _optional(body, "stream_options", dict, "an object such as {\"include_usage\": true}") or {}
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise BadRequest(f"stream_options.include_usage must be true or false, got {_shown(include_usage)}",
                         "stream_options.include_usage")
    logprobs = body.get("logprobs")
    if logprobs is not None and not (isinstance(logprobs, bool) or (_is_int(logprobs) and 0 <= logprobs <= MAX_TOP_LOGPROBS)):
        raise BadRequest(f"logprobs must be true/false or an integer in [0, {MAX_TOP_LOGPROBS}], got {_shown(logprobs)}",
                         "logprobs")
    ignore_eos = bool(_optional(body, "ignore_eos", bool, "true or false"))

    prompt = prompt_ids(ctx, body, chat)
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        max_tokens = max(ctx.max_context - len(prompt), 1) if chat else 16
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest(f"{key} must be a positive integer, got {_shown(max_tokens)}", key)
    if len(prompt) + max_tokens > ctx.max_context:
        raise BadRequest(f"prompt ({len(prompt)} tokens) + {key} ({_shown(max_tokens)}) exceeds the context "
                         f"({ctx.max_context})", key)
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not _is_number(temperature) or not 0 <= temperature <= MAX_TEMPERATURE:
        raise BadRequest(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}], got {_shown(temperature)}",
                         "temperature")
    seed = body.get("seed")
    if seed is None:
        seed = random.getrandbits(63)
    if not _is_int(seed):
        raise BadRequest(f"seed must be an integer, got {_shown(seed)}", "seed")
    extra = body.get("stop_token_ids") or []
    if not isinstance(extra, list) or not all(_is_int(t) and 0 <= t < ctx.vocab_size for t in extra):
        raise BadRequest(f"stop_token_ids must be a list of token ids in [0, {ctx.vocab_size})", "stop_token_ids")
    stop = () if ignore_eos else ctx.stop_token_ids
    request = Request(request_id, prompt, max_tokens, float(temperature), seed % (2**63),
                      tuple(sorted(set(stop) | set(extra))))
    return ParsedRequest(request, stream, bool(include_usage), bool(logprobs))
