"""Small suite texts for the suite tests, and a helper that parses one or returns its error line.

Imported by the tests in this directory (pytest puts it on sys.path): `from suite_fixtures import ...`.
"""

from __future__ import annotations

from harness.suite import SuiteError, parse_suite_text

# Line numbers matter: tests assert file:line:col into this text.
BASE = """\
version: 1
name: tiny
targets:
  tiny: {path: embedded}
drafters:
  dspark: {method: dspark, checkpoint: "embedded:dspark"}
  dflash: {method: dflash, checkpoint: "embedded:dflash"}
tasks:
  gsm8k: {n_samples: 4, max_new_tokens: 8}
  mt_bench: {n_samples: 2, max_new_tokens: 8, temperature: 0.5}
policies:
  thr07: {name: threshold, threshold: 0.7}
  static3: {name: static, verify_length: 3}
matrix:
  backend: [inhouse]
  drafter: [none, dspark]
  num_drafts: [3, 7]
  task: [gsm8k]
  concurrency: [1, 4]
"""


def error_of(text: str, path: str = "s.yaml", **kwargs) -> str:
    """The one-line SuiteError that parsing `text` raises (fails the test if it parses)."""
    try:
        parse_suite_text(text, path, **kwargs)
    except SuiteError as e:
        assert "\n" not in str(e)
        return str(e)
    raise AssertionError("expected a SuiteError")


def with_lines(text: str, **replace: str) -> str:
    """`text` with whole lines replaced: with_lines(BASE, l16="  drafter: [none]") replaces line 16."""
    lines = text.splitlines()
    for key, line in replace.items():
        lines[int(key[1:]) - 1] = line
    return "\n".join(lines) + "\n"


def at(text: str, needle: str) -> str:
    """"line:column" (1-based) of the first place `needle` is written in `text`; in "key: |value" the
    position is that of what follows the bar, so tests say which token an error must point at."""
    prefix, bar, target = needle.rpartition("|")
    whole = prefix + target if bar else needle
    for number, line in enumerate(text.splitlines(), start=1):
        if whole in line:
            return f"{number}:{line.index(whole) + len(prefix) + 1}"
    raise AssertionError(f"{whole!r} is not in the text")
