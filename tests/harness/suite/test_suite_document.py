"""Reading suite YAML: only plain data comes through, every error has file:line:col, includes merge."""

from __future__ import annotations

import pytest
from suite_fixtures import BASE, error_of

from harness.suite import SuiteError, expand, load_suite, parse_suite_text


# --- safety: data, never code ---------------------------------------------------------------------------

@pytest.mark.parametrize("value, tag", [
    ("!!python/object:os.system x", "!!python/object:os.system"),
    ("!!python/object/apply:os.system [echo hi]", "!!python/object/apply:os.system"),
    ("!!python/name:os.system ''", "!!python/name:os.system"),
    ("!!set {a, b}", "!!set"),
    ("!custom x", "!custom"),
])
def test_non_plain_tags_are_rejected_at_their_line(value, tag):
    text = BASE.replace("name: tiny", f"name: {value}")
    assert error_of(text) == (f"s.yaml:2:7: name: tag {tag} is not allowed: a suite is plain data (strings, numbers, "
                              f"booleans, null, lists, mappings)")


def test_python_object_on_a_mapping_is_rejected(tmp_path):
    marker = tmp_path / "ran"
    text = BASE + f"sla: !!python/object/apply:pathlib.Path.touch [{str(marker)!r}]\n"
    assert error_of(text).startswith("s.yaml:20:6: sla: tag !!python/object/apply:pathlib.Path.touch is not allowed")
    assert not marker.exists()


def test_a_bare_date_must_be_quoted():
    assert error_of(BASE.replace("name: tiny", "name: tiny\ndescription: 2024-01-01")) == (
        "s.yaml:3:14: description: tag !!timestamp is not allowed: a suite is plain data (strings, numbers, "
        "booleans, null, lists, mappings); quote the value to make it a string")


def test_alias_expansion_is_bounded():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))
    assert "document too large" in error_of("version: 1\n" + bomb)


def test_anchors_and_merge_keys_are_plain_yaml():
    text = BASE.replace("tasks:\n  gsm8k: {n_samples: 4, max_new_tokens: 8}",
                        "tasks:\n  gsm8k: &small {n_samples: 4, max_new_tokens: 8}\n  humaneval: {<<: *small, n_samples: 2}")
    suite = parse_suite_text(text)
    assert suite.tasks["humaneval"].n_samples == 2 and suite.tasks["humaneval"].max_new_tokens == 8


# --- malformed YAML and document shape --------------------------------------------------------------------

def test_malformed_yaml_reports_the_yaml_mark():
    assert error_of(BASE.replace("backend: [inhouse]", "backend: [inhouse")) == (
        "s.yaml:16:10: invalid YAML: expected ',' or ']', but got ':' (while parsing a flow sequence)")
    assert error_of(BASE.replace("name: tiny", "name: tiny: x")) == (
        "s.yaml:2:11: invalid YAML: mapping values are not allowed here")


def test_duplicate_keys_are_errors():
    assert error_of(BASE + "name: other\n") == "s.yaml:20:1: name: duplicate key 'name' (first at line 2)"
    assert error_of(BASE.replace("  tiny: {path: embedded}", "  tiny: {path: embedded, path: x}")) == (
        "s.yaml:4:26: targets.tiny.path: duplicate key 'path' (first at line 4)")


def test_keys_must_be_strings():
    assert error_of(BASE + "on: 3\n") == "s.yaml:20:1: keys must be strings, got true (quote it)"
    assert error_of(BASE + "gates:\n  3: {direction: higher}\n") == "s.yaml:21:3: gates: keys must be strings, got 3 (quote it)"


@pytest.mark.parametrize("text, message", [
    ("", "s.yaml:1:1: empty suite file: expected a mapping with version, name, matrix, ..."),
    ("- a\n- b\n", "s.yaml:1:1: a suite file is a mapping of keys (version, name, matrix, ...), got a list"),
    ("version: 1\nname: a\x07b\n", "s.yaml:2:8: invalid YAML: character #x0007 is not allowed (special characters "
                                   "are not allowed)"),
    ("version: 1\n---\nversion: 1\n", "s.yaml:2:1: invalid YAML: expected a single document in the stream, "
                                      "but found another document"),
])
def test_document_shape(text, message):
    assert error_of(text) == message


def test_version_is_required_and_checked():
    assert error_of(BASE.replace("version: 1\n", "")) == (
        "s.yaml:1:1: missing required key 'version' (the suite format version; this harness reads 1)")
    assert error_of(BASE.replace("version: 1", "version: 2")) == (
        "s.yaml:1:10: version: suite format version 2 is newer than this harness reads (1); upgrade dspark-harness")
    assert error_of(BASE.replace("version: 1", "version: '1'")) == "s.yaml:1:10: version: expected an integer, got '1'"
    assert error_of(BASE.replace("version: 1", "version: 0")) == "s.yaml:1:10: version: must be at least 1, got 0"


# --- include ------------------------------------------------------------------------------------------

COMMON = """\
version: 1
targets:
  tiny: {path: embedded}
drafters:
  dspark: {method: dspark, checkpoint: "embedded:dspark"}
tasks:
  gsm8k: {n_samples: 4, max_new_tokens: 8}
  mt_bench: {n_samples: 2, max_new_tokens: 8}
gates:
  acceptance_length: {direction: higher, relative: 0.05, level: warn}
"""

SUITE = """\
version: 1
name: inc
include: [common.yaml]
tasks:
  gsm8k: {n_samples: 6}
gates:
  acceptance_length: {level: fail}
matrix:
  backend: [inhouse]
  drafter: [none, dspark]
  num_drafts: [3]
  task: [gsm8k, mt_bench]
  concurrency: [1]
"""


def test_include_merges_with_the_including_file_winning(tmp_path):
    (tmp_path / "common.yaml").write_text(COMMON)
    (tmp_path / "inc.yaml").write_text(SUITE)
    suite = load_suite(tmp_path / "inc.yaml")
    assert suite.tasks["gsm8k"].n_samples == 6 and suite.tasks["gsm8k"].max_new_tokens == 8  # merged key by key
    assert suite.tasks["mt_bench"].n_samples == 2  # from the included file only
    (gate,) = suite.gates
    assert (gate.metric, gate.relative, gate.level) == ("acceptance_length", 0.05, "fail")
    assert "include" not in suite.resolved_text and suite.targets["tiny"].path == "embedded"
    assert len(expand(suite)) == 4


def test_a_list_in_the_including_file_replaces_the_included_one(tmp_path):
    (tmp_path / "base.yaml").write_text(SUITE.replace("include: [common.yaml]\n", "include: common.yaml\n"))
    (tmp_path / "common.yaml").write_text(COMMON)
    (tmp_path / "top.yaml").write_text("version: 1\nname: top\ninclude: base.yaml\nmatrix:\n  task: [mt_bench]\n")
    suite = load_suite(tmp_path / "top.yaml")
    assert suite.name == "top" and suite.matrix.task == ["mt_bench"] and suite.matrix.drafter == ["none", "dspark"]
    assert {c.task.name for c in expand(suite)} == {"mt_bench"}


def test_errors_point_into_the_included_file(tmp_path):
    (tmp_path / "common.yaml").write_text(COMMON.replace("method: dspark,", "methd: dspark,"))
    (tmp_path / "inc.yaml").write_text(SUITE)
    with pytest.raises(SuiteError) as e:
        load_suite(tmp_path / "inc.yaml")
    assert str(e.value) == (f"{tmp_path}/common.yaml:5:12: drafters.dspark.methd: unknown key 'methd' "
                            f"(did you mean 'method'?)")
    assert e.value.mark.file == f"{tmp_path}/common.yaml" and (e.value.mark.line, e.value.mark.column) == (5, 12)


def test_overridden_values_point_into_the_including_file(tmp_path):
    (tmp_path / "common.yaml").write_text(COMMON)
    (tmp_path / "inc.yaml").write_text(SUITE.replace("{n_samples: 6}", "{n_samples: 0}"))
    with pytest.raises(SuiteError, match=rf"^{tmp_path}/inc.yaml:5:22: tasks.gsm8k.n_samples: must be at least 1"):
        load_suite(tmp_path / "inc.yaml")


def test_include_paths_are_relative_to_the_including_file(tmp_path, monkeypatch):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "common.yaml").write_text(COMMON)
    (tmp_path / "suites" / "inc.yaml").write_text(SUITE)
    monkeypatch.chdir(tmp_path)
    assert load_suite("suites/inc.yaml").tasks["gsm8k"].n_samples == 6
    (tmp_path / "suites" / "common.yaml").write_text(COMMON.replace("n_samples: 2", "n_samples: -2"))
    with pytest.raises(SuiteError, match=r"^suites/common.yaml:8:25: tasks.mt_bench.n_samples: must be at least 1"):
        load_suite("suites/inc.yaml")


def test_include_not_found_suggests_a_sibling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "common.yaml").write_text(COMMON)
    (tmp_path / "inc.yaml").write_text(SUITE.replace("[common.yaml]", "[commn.yaml]"))
    with pytest.raises(SuiteError) as e:
        load_suite("inc.yaml")
    assert str(e.value) == "inc.yaml:3:11: include[0]: included file commn.yaml not found (did you mean 'common.yaml'?)"


def test_include_cycles_are_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text("version: 1\ninclude: [b.yaml]\n")
    (tmp_path / "b.yaml").write_text("version: 1\ninclude: [c.yaml]\n")
    (tmp_path / "c.yaml").write_text("version: 1\ninclude: [a.yaml]\n")
    with pytest.raises(SuiteError) as e:
        load_suite("a.yaml")
    assert str(e.value) == "c.yaml:2:11: include[0]: include cycle: a.yaml -> b.yaml -> c.yaml -> a.yaml"
    (tmp_path / "self.yaml").write_text("version: 1\ninclude: self.yaml\n")
    with pytest.raises(SuiteError, match=r"^self.yaml:2:10: include: include cycle: self.yaml -> self.yaml$"):
        load_suite("self.yaml")


def test_a_file_included_along_two_paths_is_not_a_cycle(tmp_path):
    (tmp_path / "common.yaml").write_text(COMMON)
    (tmp_path / "left.yaml").write_text("version: 1\ninclude: common.yaml\n")
    (tmp_path / "right.yaml").write_text("version: 1\ninclude: common.yaml\n")
    (tmp_path / "inc.yaml").write_text(SUITE.replace("[common.yaml]", "[left.yaml, right.yaml]"))
    assert len(expand(load_suite(tmp_path / "inc.yaml"))) == 4


def test_include_needs_a_file_on_disk():
    assert error_of("version: 1\ninclude: [common.yaml]\n", "<text>") == (
        "<text>:2:11: include[0]: cannot include 'common.yaml' from <text>: includes are resolved from the "
        "including file's directory (store Suite.resolved_text instead)")


def test_included_files_must_be_a_supported_version(tmp_path):
    (tmp_path / "common.yaml").write_text(COMMON.replace("version: 1", "version: 3"))
    (tmp_path / "inc.yaml").write_text(SUITE)
    with pytest.raises(SuiteError, match=r"common.yaml:1:10: version: suite format version 3 is newer"):
        load_suite(tmp_path / "inc.yaml")


def test_a_fragment_alone_is_not_a_suite(tmp_path):
    (tmp_path / "common.yaml").write_text(COMMON)
    with pytest.raises(SuiteError) as e:
        load_suite(tmp_path / "common.yaml")
    assert str(e.value) == (f"{tmp_path}/common.yaml:1:1: no matrix: this file defines no cells, so it is a fragment "
                            f"to `include:` from a suite, not a runnable suite")


def test_missing_suite_file_suggests_a_sibling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "cpu.yaml").write_text(BASE)
    with pytest.raises(SuiteError) as e:
        load_suite("suites/cpuu.yaml")
    assert str(e.value) == "suites/cpuu.yaml: no such suite file (did you mean 'cpu.yaml'?); suites there: cpu.yaml"
