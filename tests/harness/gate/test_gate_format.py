"""Renderings of a gate report: text lines with the why, a markdown table, JUnit XML that parses."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from gate_tables import DSPARK, PLAIN, SynthCell, SynthRun, add_run, copy_run, lower_acceptance, new_store
from harness.gate import ExitCode, GateRule, Validity, render, run_gate, to_junit, to_markdown, to_text
from harness.gate.format import change, num

RULES = [
    GateRule("acceptance_length", "higher"),
    GateRule("accepted_per_step", "higher", level="warn"),
    GateRule("ece_raw", "lower", relative=None, absolute=0.5),  # fewer acceptances worsen ECE too: allowed here
    GateRule("throughput", "higher", test="mann_whitney", min_samples=1),
]
NEW = SynthCell(drafter="dflash", method="dflash")


@pytest.fixture(scope="module")
def report():
    """One blocking regression (τ), one warning (accepted per step), inconclusive throughput (1 vs 1
    repeat), a failed plain cell, and a new cell without baseline."""
    conn = new_store()
    add_run(conn, SynthRun("base"))
    add_run(conn, SynthRun("cand", cells=[PLAIN, DSPARK, NEW]))
    lower_acceptance(conn, "cand", DSPARK)
    conn.execute("UPDATE cells SET status = 'failed', error = 'boom' WHERE run_id = 'cand' AND cell_id = ?",
                 [PLAIN.cell_id])
    return run_gate((conn, "cand"), (conn, "base"), RULES, Validity(max_failed_fraction=0.5))


def test_report_content(report):
    assert report.exit_code == ExitCode.REGRESSION
    verdicts = {(c.metric, c.verdict, c.blocking) for c in report.comparisons}
    assert ("acceptance_length", "regression", True) in verdicts
    assert ("accepted_per_step", "regression", False) in verdicts
    assert ("throughput", "inconclusive", False) in verdicts


def test_text_says_why(report):
    text = to_text(report)
    first = text.splitlines()[0]
    assert first.startswith("FAIL:") and "1 regression" in first and "1 failed cell" in first
    assert "1 warning" in first and "1 cell without baseline" in first
    regression = next(l for l in text.splitlines() if l.startswith("REGRESSION ") and "acceptance_length" in l)
    assert f"{DSPARK.label}: " in regression
    assert "95% CI" in regression and "p=" in regression and "detectable ≥" in regression
    assert "−" in regression  # a drop, written with a real minus sign
    assert "REGRESSION (warn) accepted_per_step" in text
    assert "INCONCLUSIVE throughput" in text and "n too small" in text
    assert f"FAILED CELL  {PLAIN.label}" in text and "boom" in text
    assert f"NO BASELINE  {NEW.label}: no baseline cell with this id" in text


def test_markdown_has_verdict_and_table(report):
    md = to_markdown(report)
    lines = md.splitlines()
    assert lines[0].startswith("❌ **FAIL:")
    header = next(i for i, l in enumerate(lines) if l.startswith("| verdict | metric | cell |"))
    assert lines[header + 1].startswith("|---")
    rows = [l for l in lines[header + 2:] if l.startswith("| ")]
    assert len(rows) == len(report.comparisons)
    assert rows[0].startswith("| ❌ regression | `acceptance_length` |")
    assert all(l.count(" | ") == lines[header].count(" | ") for l in rows)  # labels with | are escaped
    assert "Failed cells:" in md and "Cells without a comparable baseline:" in md


def test_junit_parses_with_the_right_counts(report):
    root = ET.fromstring(to_junit(report).encode())
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    failures = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    # 1 blocking regression + 1 failed cell; the warning passes.
    assert len(failures) == 2 == int(suite.get("failures")) == int(root.get("failures"))
    assert {(c.get("name"), c.find("failure").get("type")) for c in failures} == {
        ("acceptance_length", "regression"), ("cell", "failed-cell")}
    # inconclusive throughput + the cell without baseline
    assert len(skipped) == int(suite.get("skipped")) == 2
    assert int(suite.get("tests")) == len(cases) == 1 + 1 + len(report.comparisons) + 1


def test_junit_of_an_invalid_run_has_one_failure():
    conn = new_store()
    add_run(conn, SynthRun("base"))
    add_run(conn, SynthRun("cand", status="interrupted"))
    report = run_gate((conn, "cand"), (conn, "base"), RULES)
    root = ET.fromstring(to_junit(report).encode())
    failures = root.findall(".//failure")
    assert len(failures) == 1 and failures[0].get("type") == "invalid"
    assert "interrupted" in failures[0].text
    assert to_markdown(report).startswith("⛔ **INVALID")


def test_render_dispatch(report):
    assert render(report, "text") == to_text(report)
    with pytest.raises(ValueError, match="format must be one of"):
        render(report, "html")


@pytest.mark.parametrize("value,text", [(3.4215, "3.42"), (1234.56, "1235"), (0.02134, "0.0213"), (None, "n/a"),
                                        (-2.5, "−2.5")])
def test_num(value, text):
    assert num(value) == text


def test_change():
    assert change(-0.0703, "relative") == "−7.0%"
    assert change(0.0123, "absolute") == "+0.0123"
