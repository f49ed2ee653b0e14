"""A Suite and its resolved text: what a run stores re-parses to the same suite, hash and cells."""

from __future__ import annotations

import dataclasses

import pytest
from suite_fixtures import BASE

from harness.suite import Suite, expand, load_suite, parse_suite_text

COMMON = """\
version: 1
targets:
  tiny: {path: embedded}
drafters:
  dspark: {method: dspark, checkpoint: "embedded:dspark"}
tasks:
  gsm8k: {n_samples: 4, max_new_tokens: 8}
gates:
  acceptance_length: {direction: higher, relative: 0.05}
"""


@pytest.fixture
def included(tmp_path) -> Suite:
    (tmp_path / "common.yaml").write_text(COMMON)
    (tmp_path / "s.yaml").write_text("""\
# a comment
version: 1
name: s
description: with an include
include: [common.yaml]
policies: {thr07: {name: threshold, threshold: 0.7}}
matrix:
  backend: [inhouse]
  drafter: [none, dspark]
  num_drafts: [3, 7]
  policy: [full, thr07]
  concurrency: [1, 4]
  include: [{drafter: dspark, num_drafts: 5, rate: 2.0}]
""")
    return load_suite(tmp_path / "s.yaml")


def test_suite_fields(included, tmp_path):
    assert (included.name, included.version, included.description) == ("s", 1, "with an include")
    assert included.path == str(tmp_path / "s.yaml") and included.text.startswith("# a comment")
    assert len(included.hash) == 64 and set(included.targets) == {"tiny"} and set(included.policies) == {"thr07"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        included.name = "other"  # type: ignore[misc]


def test_resolved_text_round_trips(included):
    again = parse_suite_text(included.resolved_text)
    assert again.hash == included.hash and again.resolved_text == included.resolved_text
    assert again.gates == included.gates and again.validity == included.validity
    assert [c.cell_id for c in expand(again)] == [c.cell_id for c in expand(included)]
    assert expand(again) == expand(included)
    assert again.path == "<text>" and again.text == included.resolved_text


def test_resolved_text_is_canonical(included):
    text = included.resolved_text
    assert "include:" not in text.split("matrix:")[0] and "# a comment" not in text
    assert text.startswith("version: 1\nname: s\ndescription: with an include\n")
    assert "  dspark: {checkpoint: 'embedded:dspark', method: dspark}\n" in text
    assert parse_suite_text(text).resolved_text == text  # a fixed point


def test_hash_follows_content_not_formatting():
    a = parse_suite_text(BASE)
    spaced = BASE.replace("{n_samples: 4, max_new_tokens: 8}", "\n    n_samples: 4   # small\n    max_new_tokens: 8")
    assert parse_suite_text(spaced).hash == a.hash
    assert parse_suite_text(BASE.replace("n_samples: 4", "n_samples: 5")).hash != a.hash

