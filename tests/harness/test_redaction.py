"""Fuzz table: a text with a secret in it → what `redact` leaves (no secret, the mask where it was, the rest
intact)."""

from __future__ import annotations

import pytest

from contracts import redaction
from contracts.redaction import MASK, redact

KEY = "sk-proj-Zq81xY0aB7c"

# (id, text, wanted)
ROWS = [
    ("header line", f"Authorization: Bearer {KEY}", f"Authorization: {MASK}"),
    ("header lower case", f"authorization: bearer {KEY}\nnext", f"authorization: {MASK}\nnext"),
    ("header in JSON", f'{{"Authorization": "Bearer {KEY}", "x": 1}}', f'{{"Authorization": "{MASK}", "x": 1}}'),
    ("basic auth", "Authorization: Basic dXNlcjpwYXNzd29yZA==", f"Authorization: {MASK}"),
    ("bare bearer", f"token was Bearer {KEY}.", f"token was Bearer {MASK}."),
    ("api_key query", f"GET /v1?api_key={KEY}&x=1", f"GET /v1?api_key={MASK}&x=1"),
    ("x-api-key header", f"x-api-key: {KEY}", f"x-api-key: {MASK}"),
    ("registered value alone", f"the server said {KEY} twice: {KEY}", f"the server said {MASK} twice: {MASK}"),
    ("api_key_env name kept", "api_key_env: OPENAI_API_KEY", "api_key_env: OPENAI_API_KEY"),
    ("no secret", "HTTP 500: upstream timed out", "HTTP 500: upstream timed out"),
    ("empty", "", ""),
]


@pytest.mark.parametrize("text,wanted", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_redaction_table(text, wanted, monkeypatch):
    monkeypatch.setattr(redaction, "_registered", {KEY})
    assert redact(text) == wanted
    assert KEY not in redact(text)


def test_secret_values_come_from_registration_and_secret_named_variables(monkeypatch):
    monkeypatch.setattr(redaction, "_registered", set())
    monkeypatch.setenv("MY_SERVICE_API_KEY", "value-of-the-api-key")
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijkl")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false-but-long-enough")  # not a secret by its name
    monkeypatch.setenv("SUITE_KEY_VAR", "only-known-once-named")
    values = redaction.secret_values()
    assert {"value-of-the-api-key", "hf_abcdefghijkl"} <= set(values)
    assert "false-but-long-enough" not in values and "only-known-once-named" not in values
    redaction.register_from_options({"api_key_env": "SUITE_KEY_VAR", "base_url": "http://x"})
    redaction.register("short")  # too short to be a secret: never redacted
    assert redact("x only-known-once-named short") == f"x {MASK} short"
    assert redact(None) is None
