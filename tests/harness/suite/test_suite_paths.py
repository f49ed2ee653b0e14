"""check_paths: local and embedded model directories and SPS tables the cells use must exist; hub ids are
not checked. Model strings resolve through inputs.model_refs, as the backends resolve them."""

from __future__ import annotations

from pathlib import Path

import pytest
from suite_fixtures import BASE, at

from harness.suite import SuiteError, check_paths, expand, parse_suite_text, select


@pytest.fixture
def embedded(tmp_path, monkeypatch):
    """A fake embedded default with a target and the drafts asked for, via $HARNESS_EMBEDDED_DIR."""
    def make(*drafts: str, target: bool = True) -> Path:
        root = tmp_path / "models" / "embedded"
        root.mkdir(parents=True)
        if target:
            (root / "target").mkdir()
        for name in drafts:
            (root / "drafts" / name).mkdir(parents=True)
        monkeypatch.setenv("HARNESS_EMBEDDED_DIR", str(root))
        return root
    return make


def test_the_committed_embedded_default_passes(monkeypatch):
    monkeypatch.delenv("HARNESS_EMBEDDED_DIR", raising=False)
    check_paths(parse_suite_text(BASE))


def test_missing_embedded_draft_names_the_line_and_the_available_ones(embedded):
    root = embedded("dflash", "dspark-rnn")
    with pytest.raises(SuiteError) as e:
        check_paths(parse_suite_text(BASE, "s.yaml"))
    where = at(BASE, 'checkpoint: |"embedded:dspark')
    assert str(e.value) == (f"s.yaml:{where}: drafters.dspark.checkpoint: embedded:dspark resolves to "
                            f"{root}/drafts/dspark, which does not exist (did you mean 'dspark-rnn'?); embedded "
                            f"drafts: dflash, dspark-rnn")


def test_missing_embedded_target(embedded):
    root = embedded("dspark", target=False)
    with pytest.raises(SuiteError) as e:
        check_paths(parse_suite_text(BASE, "s.yaml"))
    assert str(e.value) == (f"s.yaml:{at(BASE, 'path: |embedded')}: targets.tiny.path: embedded resolves to "
                            f"{root}/target, which does not exist (set $HARNESS_EMBEDDED_DIR, or rebuild with "
                            f"python3 -m recipes.embedded.build)")


def test_only_what_the_cells_use_is_checked(embedded):
    embedded()  # no drafts at all; dflash is defined but unused, dspark is used
    suite = parse_suite_text(BASE)
    with pytest.raises(SuiteError, match="embedded:dspark resolves to"):
        check_paths(suite)
    check_paths(suite, select(expand(suite), ["drafter=none"]))  # an --only run needs only what it runs


def test_local_paths_are_checked_and_hub_ids_are_not(embedded, tmp_path, monkeypatch):
    embedded()
    monkeypatch.chdir(tmp_path)
    text = BASE.replace('"embedded:dspark"', "./drafts/dspark").replace("{path: embedded}", "{path: Qwen/Qwen3-8B}")
    with pytest.raises(SuiteError) as e:
        check_paths(parse_suite_text(text, "s.yaml"))
    assert str(e.value) == (f"s.yaml:{at(text, './drafts')}: drafters.dspark.checkpoint: ./drafts/dspark resolves to "
                            f"{tmp_path}/drafts/dspark, which does not exist")
    (tmp_path / "drafts" / "dspark").mkdir(parents=True)
    check_paths(parse_suite_text(text, "s.yaml"))


def test_sps_tables_are_checked(embedded, tmp_path, monkeypatch):
    embedded("dspark")
    monkeypatch.chdir(tmp_path)
    text = BASE.replace("{name: threshold, threshold: 0.7}", "{name: threshold, threshold: 0.7}\n"
                                                             "  sched: {name: scheduler, sps_table: sps.json}")
    check_paths(parse_suite_text(text))  # no cell uses it
    text += "  policy: [sched]\n"
    with pytest.raises(SuiteError) as e:
        check_paths(parse_suite_text(text, "s.yaml"))
    assert str(e.value) == (f"s.yaml:{at(text, 'sps_table: |sps.json')}: policies.sched.sps_table: SPS table "
                            f"{tmp_path}/sps.json does not exist")
    (tmp_path / "sps.json").write_text("{}")
    check_paths(parse_suite_text(text))


def test_a_missing_real_target_draft_says_how_to_build_it(embedded):
    embedded()
    text = BASE.replace('"embedded:dspark"', '"smollm2-135m:nope"')
    with pytest.raises(SuiteError) as e:
        check_paths(parse_suite_text(text, "s.yaml"), select(expand(parse_suite_text(text)), ["drafter=dspark"]))
    assert "smollm2-135m:nope resolves to" in str(e.value) and "drafts/nope, which does not exist" in str(e.value)
    assert "python3 -m recipes.real.build" in str(e.value) and str(e.value).count("\n") == 0
