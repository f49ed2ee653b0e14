"""Secrets out of every error, log and exported row.

A server can echo what it was sent — an OpenAI-compatible endpoint that puts the request's
`Authorization` header into its 500 body hands the API key back — and what a cell records (its error,
its log, each request's error) goes into the store and from there into committed baseline exports. So
every such text passes `redact` before it is recorded, logged or exported:

  - the values of known secrets are replaced wherever they appear: each value `register`ed (the openai
    backend registers the key it reads from `api_key_env`; the runner registers those named by a suite's
    `backend_options.*.api_key_env`), and every environment variable whose name marks it a secret
    (`*API_KEY*`, `*TOKEN*`, `*SECRET*`, `*PASSWORD*`);
  - credential patterns are masked whatever their value: `Bearer …`, `Authorization: …`, `api_key=…`,
    `x-api-key: …`.

Values shorter than `MIN_SECRET_CHARS` are not treated as secrets (a 2-character "token" would redact
half of every log).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:
    from contracts.cells import CellResult

MASK = "[REDACTED]"
MIN_SECRET_CHARS = 8
SECRET_NAME = re.compile(r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD)(?:$|_)", re.IGNORECASE)
PATTERNS = (
    # Authorization: Bearer xyz / "authorization": "Basic xyz" / authorization=xyz
    (re.compile(r"""(?i)(authorization["']?\s*[:=]\s*["']?)(?:(?:bearer|basic|token)\s+)?[^\s"',;}]+"""), r"\1" + MASK),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=:-]+"), r"\1" + MASK),
    (re.compile(r"""(?i)((?:x-)?api[-_]?key["']?\s*[:=]\s*["']?)[^\s"',;}&]+"""), r"\1" + MASK),
)

_registered: set[str] = set()


def register(value: str | None) -> None:
    """A secret value to redact from now on (in this process)."""
    if value and len(value) >= MIN_SECRET_CHARS:
        _registered.add(value)


def register_from_options(options: Mapping[str, object], environ: Mapping[str, str] = os.environ) -> None:
    """The values of the environment variables a backend's options name as secret (`*_env` options such
    as the openai backend's `api_key_env`)."""
    for key, name in options.items():
        if key.endswith("_env") and isinstance(name, str):
            register(environ.get(name))


def secret_values(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every value redacted now, longest first (a secret that contains another is masked whole)."""
    values = set(_registered)
    values |= {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def redact(text: str | None, extra: Iterable[str] = ()) -> str | None:
    """`text` with every known secret value and credential pattern masked (None stays None)."""
    if not text:
        return text
    for value in [*(v for v in extra if v and len(v) >= MIN_SECRET_CHARS), *secret_values()]:
        if value in text:
            text = text.replace(value, MASK)
    for pattern, replacement in PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_result(result: CellResult | None) -> CellResult | None:
    """A cell result (`contracts.cells.CellResult`) with its log and every request's error redacted."""
    if result is None:
        return result
    requests = [r if not r.record.error else replace(r, record=replace(r.record, error=redact(r.record.error)))
                for r in result.requests]
    return replace(result, log=redact(result.log) or "", requests=requests)
