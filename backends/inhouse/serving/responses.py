"""The bodies the server answers with: completions, stream chunks, usage with the spec extension, errors.

Extensions of the OpenAI schema: each choice carries `token_ids` (the first streamed chunk also
`prompt_token_ids`); `usage` carries the request's speculative steps — `spec_num_drafts` (γ),
`spec_verify_ct`, `spec_verified_per_step`, `spec_accepted_per_step`, and with a confidence head
`spec_confidence_logits_per_step` (the raw logit of each verified draft, so calibration is measured
through the server too). The engine computes no logprobs: asked for, they list the tokens with
`logprob: null`.
"""

from __future__ import annotations

import time
from typing import Any

from backends.inhouse.engine import Completed, Request


def error_body(status: int, message: str, param: str | None = None, kind: str | None = None) -> dict[str, Any]:
    """OpenAI's error object (`code` is the status, as vLLM sends it); `message` also at the top, as vLLM."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    if status == 404 and kind == "invalid_request_error":
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}, "object": "error",
            "message": message}


class IncrementalText:
    """Incremental detokenisation: each call returns the text the new ids add (held back while it ends in
    an incomplete character); the pieces join to decode(all ids)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.sent = tokenizer, [], ""

    def add(self, ids: list[int], final: bool = False) -> str:
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""
        delta = text[len(self.sent):]  # (a tokenizer that rewrote earlier text cannot take it back)
        self.sent = text
        return delta


def usage(prompt_tokens: int, done: Completed) -> dict[str, Any]:
    c = done.counters
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": len(done.output_ids),
           "total_tokens": prompt_tokens + len(done.output_ids), "spec_num_drafts": c.num_drafts,
           "spec_verify_ct": c.num_steps, "spec_verified_per_step": list(c.num_verified),
           "spec_accepted_per_step": list(c.num_accepted)}
    if c.confidence_logits and len(c.confidence_logits) == c.num_steps:  # drafts with a confidence head
        out["spec_confidence_logits_per_step"] = [list(step) for step in c.confidence_logits]
    return out


def logprobs(tokenizer, ids: list[int], chat: bool, offset: int) -> dict[str, Any]:
    tokens = tokenizer.convert_ids_to_tokens(ids)
    if chat:
        return {"content": [{"token": t, "logprob": None, "top_logprobs": []} for t in tokens]}
    return {"tokens": tokens, "token_logprobs": [None] * len(ids), "top_logprobs": None,
            "text_offset": [offset] * len(ids)}


def completion(tokenizer, model: str, request: Request, done: Completed, chat: bool, with_logprobs: bool) -> dict:
    text = tokenizer.decode(done.output_ids, skip_special_tokens=True)
    choice: dict[str, Any] = {"index": 0, "finish_reason": done.finish_reason, "token_ids": list(done.output_ids),
                              "logprobs": logprobs(tokenizer, done.output_ids, chat, 0) if with_logprobs else None}
    choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    return {"id": request.request_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(len(request.prompt_ids), done)}


class Chunks:
    """The chunks of one streamed answer, in order."""

    def __init__(self, tokenizer, model: str, request: Request, chat: bool, with_logprobs: bool):
        self.tokenizer, self.request, self.chat, self.with_logprobs = tokenizer, request, chat, with_logprobs
        self.head = {"id": request.request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": model}
        self.text, self.first, self.offset = IncrementalText(tokenizer), True, 0

    def tokens(self, ids: list[int]) -> dict:
        """One engine step's tokens: one chunk."""
        chunk = self._chunk(ids, self.text.add(ids), None)
        self.offset += len(ids)
        return chunk

    def final(self, done: Completed) -> dict:
        return self._chunk([], self.text.add([], final=True), done.finish_reason)

    def usage(self, done: Completed) -> dict:
        return self.head | {"choices": [], "usage": usage(len(self.request.prompt_ids), done)}

    def _chunk(self, ids: list[int], delta: str, finish_reason: str | None) -> dict:
        with_logprobs = self.with_logprobs and ids
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "token_ids": ids,
                                  "logprobs": logprobs(self.tokenizer, ids, self.chat, self.offset) if with_logprobs else None}
        if self.chat:
            choice["delta"] = ({"role": "assistant"} if self.first else {}) | {"content": delta}
        else:
            choice["text"] = delta
        if self.first:
            choice["prompt_token_ids"] = list(self.request.prompt_ids)
        self.first = False
        return self.head | {"choices": [choice]}
