"""`harness report`: the page and its PNGs from a recorded store, escaping, empty sections, exit codes."""

from __future__ import annotations

import datetime as dt
import re

import numpy as np
import pytest

from harness.gate import data as gate_data
from harness.gate.stats import ece_table
from harness.report import report_command
from harness.report.data import load_run
from harness.store import Store
from report_fixtures import T0, full_run_cells, make_cell, make_result, record_run

PNG = b"\x89PNG\r\n\x1a\n"
SECTIONS = ("Run", "Acceptance length τ vs γ", "Per-position acceptance", "Reliability diagram (ECE)",
            "Per-user speed vs throughput (Pareto)", "Throughput and per-user speed vs load", "TTFT and TPOT vs load",
            "History of acceptance_length", "Summary")


@pytest.fixture(scope="module")
def full_store(tmp_path_factory):
    """Three runs of suite '<script>' with every kind of cell (the newest has the failed one) and one
    run of another suite in between, which the history must not include."""
    path = tmp_path_factory.mktemp("report") / "h.duckdb"
    with Store.open(path) as store:
        suite = "<script>alert(1)</script>"
        for i, accept in enumerate((0.5, 0.52, 0.8)):
            cells = full_run_cells(seed=i, accept=accept)
            if i < 2:
                cells = [c for c in cells if c[2] is None]
            run_id = record_run(store, cells, started_at=T0 + dt.timedelta(hours=2 * i), suite_name=suite)
            if i == 0:
                record_run(store, cells[:3], started_at=T0 + dt.timedelta(hours=1), suite_name="other")
    return path, run_id


def test_report_writes_every_section_and_figure(full_store, tmp_path, capsys):
    path, run_id = full_store
    out = tmp_path / "site" / "report"
    assert report_command(path, run_id, out) == 0
    page = out / "index.html"
    assert capsys.readouterr().out.strip() == str(page)
    text = page.read_text(encoding="utf-8")
    for title in SECTIONS:
        assert f"<h2>{title}</h2>" in text
    images = re.findall(r'<img src="([^"]+)"', text)
    assert set(images) == {"acceptance.png", "positions.png", "calibration.png", "pareto.png", "load_concurrency.png",
                           "latency_concurrency.png", "history.png"}
    for name in images:
        assert (out / name).read_bytes()[:8] == PNG
    # self-contained: no script, nothing from a network
    assert "<script" not in text.lower() and "http://" not in text and "https://" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # the suite name, escaped
    assert "&lt;script&gt;alert(&#x27;boom&#x27;)&lt;/script&gt; &amp; more" in text  # the failed cell's error
    assert "ECE calibrated" in text and "Failed cells (1)" in text
    assert "no plain-decoding cell" not in text  # this run has plain cells: speedups are there
    assert "3 runs of suite" in text  # the other suite's run is not in the history


def test_report_data_pools_per_line(full_store):
    path, run_id = full_store
    with Store.open(path, read_only=True) as store:
        data = load_run(store, run_id)
    # τ per (task, drafter, policy, T, γ): pooled over both loads, so one row each
    keys = [(r["drafter"], r["policy"], r["num_drafts"]) for r in data.tau]
    expected = [("dspark", p, g) for p in ("full", "static") for g in (2, 4)] + [("dflash", "scheduler", 4)]
    assert sorted(keys) == sorted(expected)
    assert all(1 <= r["tau"] <= 1 + r["num_drafts"] for r in data.tau)
    # positions only at each drafter's (and policy's) largest γ, policies apart
    assert {(r["drafter"], r["policy"], r["gamma"]) for r in data.positions} == {
        ("dspark", "full", 4), ("dspark", "static", 4), ("dflash", "scheduler", 4)}
    # each α_k / β_k with the card's interval over the conversations of the row's cells (both loads here)
    from harness.gate.data import conversation_positions
    from harness.gate.stats import clustered_wilson

    with Store.open(path, read_only=True) as store:
        counts = conversation_positions(store.con, run_id)
        cells = store.con.execute("SELECT DISTINCT cell_id FROM cells WHERE run_id = ? AND status = 'ok' AND drafter = "
                                  "'dflash'", [run_id]).fetchall()
    row = next(r for r in data.positions if r["drafter"] == "dflash" and r["position"] == 2)
    parts = [counts[c] for (c,) in cells]
    accepted = np.concatenate([c.accepted[:, 1] for c in parts])
    assert (row["alpha_lo"], row["alpha_hi"]) == clustered_wilson(accepted, np.concatenate([c.verified[:, 1] for c in parts]))
    assert (row["beta_lo"], row["beta_hi"]) == clustered_wilson(accepted, np.concatenate([c.reached[:, 1] for c in parts]))
    assert all(r["alpha_lo"] <= r["unconditional"] <= r["alpha_hi"] for r in data.positions if r["verified"])
    # every aggregated point carries its repeats' range
    assert all(r["tau_lo"] <= r["tau"] <= r["tau_hi"] for r in data.tau)
    assert all(r["throughput_lo"] <= r["throughput"] <= r["throughput_hi"] for r in data.load)
    assert {r["drafter"] for r in data.calibration} == {"dspark"}  # dflash has no confidence head
    speedups = [r["speedup"] for r in data.load if r["method"] != "none"]
    assert speedups and all(s is not None and s > 0 for s in speedups)
    assert len(data.summary) == len(data.cells) == 13
    failed = [r for r in data.summary if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["acceptance_length"] is None
    assert len({r.run_id for r in data.history}) == 3


def test_one_ece_in_summary_diagram_and_view(tmp_path):
    """A drafter with one cell: the calibration section's ECE (read off the diagram's per-position bins),
    the summary table's ece_* (the stored metric) and the v_ece view are one number, per kind."""
    from harness.report.sections import calibration_section
    path = tmp_path / "h.duckdb"
    with Store.open(path) as store:
        run_id = record_run(store, [(make_cell("dspark", 4), make_result(3, gamma=4, confidences=True), None)])
        data = load_run(store, run_id)
        _, view = store.query("SELECT kind, ece FROM v_ece WHERE run_id = ?", [run_id])
        (cell_id,) = store.con.execute("SELECT cell_id FROM cells WHERE run_id = ?", [run_id]).fetchone()
        cycles = gate_data.confidence_cycles(store.con, run_id, cell_id)
    (summary,) = data.summary
    section = calibration_section(data, tmp_path)
    assert (tmp_path / "calibration.png").read_bytes()[:8] == PNG
    for kind, value in view:
        stored = summary[f"ece_{kind}"]
        assert value == pytest.approx(stored, abs=1e-12)
        assert f">{stored:.4g}<" in section.body
    assert {r["position"] for r in data.calibration} == {1, 2, 3, 4}
    assert "ece_position_raw" in section.body and "Wilson" in section.body
    from harness.report.reliability import Bin, ece, ece_interval, mean_gap

    for kind, _value in view:  # each ECE of the table with its interval beside it
        bins = [Bin(r["position"], r["bin"], r["lower"], r["upper"], r["count"], r["confidence_sum"], r["outcome_sum"])
                for r in data.calibration if r["kind"] == kind and r["count"]]
        low, high = ece_interval(bins)
        assert 0 <= low < high < 1 and f"[{low:.3g}, {high:.3g}]" in section.body
        gap = mean_gap(bins)  # signed, never more than the ECE, printed beside it
        assert gap is not None and abs(gap) <= ece(bins) + 1e-12 and f">{gap:.4g}<" in section.body
        if kind == "raw":  # the card's mean gap (EceTable.mean_gap over the gate's cycles) is the same number
            table = ece_table(cycles.logits, cycles.num_verified, cycles.num_accepted,
                              np.zeros(len(cycles.num_verified), dtype=np.int64), 1)
            assert gap == pytest.approx(float(table.mean_gap(np.ones((1, 1)))[0]), abs=1e-12)
    assert "binomial bootstrap over the bins" in section.body


def test_the_ece_interval_covers_the_population_ece_at_about_its_rate():
    """Simulated bins with known accuracies: the basic binomial-bootstrap interval covers the population
    ECE in ≥ 83% of runs at a nominal 95% (measured 87–90%: reliability.ece_interval), narrows with more
    cycles, and is reproducible; the plain percentile interval would cover far less."""
    import numpy as np

    from harness.report.reliability import Bin, ece, ece_interval

    rng = np.random.default_rng(5)
    hits, widths = 0, {30: [], 300: []}
    for rep in range(200):
        for n in (30, 300):
            bins, gap_sum, total = [], 0.0, 0
            for j in (1, 2):
                for b in range(0, 20, 4):
                    conf = (b + 0.5) / 20
                    acc = max(0.0, conf - 0.05 * j)
                    count = int(rng.integers(n // 2, n))
                    bins.append(Bin(j, b, b / 20, (b + 1) / 20, count, conf * count, float(rng.binomial(count, acc))))
                    gap_sum, total = gap_sum + count * abs(conf - acc), total + count
            low, high = ece_interval(bins, draws=500, seed=rep)
            widths[n].append(high - low)
            if n == 30:
                hits += low <= gap_sum / total <= high
            assert low < high and ece(bins) > low  # bias-corrected: below the plug-in, never wholly above it
    assert hits / 200 >= 0.83
    assert np.mean(widths[300]) < 0.5 * np.mean(widths[30])
    assert ece_interval(bins, seed=1) == ece_interval(bins, seed=1) and ece_interval([]) is None


def test_report_of_a_bare_run_says_what_is_missing(tmp_path):
    """One drafter, one γ, no confidence head, no plain cell, the suite's first run."""
    path = tmp_path / "h.duckdb"
    with Store.open(path) as store:
        run_id = record_run(store, [(make_cell("dflash", 4), make_result(1, gamma=4), None)], finish=False)
    out = tmp_path / "out"
    assert report_command(path, "latest", out) == 0  # 'latest' includes a run still marked running
    text = (out / "index.html").read_text(encoding="utf-8")
    assert run_id in text
    assert "Only γ = 4 was measured" in text
    assert "No calibration bins in this run" in text
    assert "This run has no plain-decoding cell" in text
    assert "the only run of suite cpu" in text
    assert "Every cell succeeded." in text
    assert not (out / "calibration.png").exists() and not (out / "history.png").exists()
    assert (out / "acceptance.png").exists() and (out / "load_concurrency.png").exists()


def test_open_loop_tasks_and_temperatures_get_their_own_lines(tmp_path):
    """Cells at a request rate plot against the rate; several tasks make several panels, several
    temperatures name T in the labels; a plain cell at each rate gives speedups."""
    path = tmp_path / "h.duckdb"
    cells = []
    for task in ("gsm8k", "humaneval"):
        for temperature in (0.0, 0.7):
            for rate in (2.0, 8.0):
                plain = make_result(int(rate), gamma=0)
                cells.append((make_cell("plain", task=task, temperature=temperature, rate=rate), plain, None))
                cells.append((make_cell("dspark", 4, task=task, temperature=temperature, rate=rate),
                              make_result(int(rate) + 1, gamma=4, plain=plain), None))
    with Store.open(path) as store:
        run_id = record_run(store, cells)
        data = load_run(store, run_id)
    points = {(t, x) for t in ("gsm8k", "humaneval") for x in (0.0, 0.7)}
    assert {(r["task"], r["temperature"]) for r in data.tau} == points
    assert all(r["speedup"] is not None for r in data.load if r["method"] != "none")
    out = tmp_path / "out"
    assert report_command(path, run_id, out) == 0
    text = (out / "index.html").read_text(encoding="utf-8")
    assert 'src="load_rate.png"' in text and not (out / "load_concurrency.png").exists()
    assert "This run has no plain-decoding cell" not in text


def test_report_of_a_run_without_cells(tmp_path):
    path = tmp_path / "h.duckdb"
    with Store.open(path) as store:
        record_run(store, [])
    out = tmp_path / "out"
    assert report_command(path, "latest", out) == 0
    text = (out / "index.html").read_text(encoding="utf-8")
    assert "This run recorded no cells." in text and "<img" not in text


def test_report_errors_are_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "h.duckdb"
    assert report_command(path, "latest", tmp_path / "out") == 2  # no store file
    err = capsys.readouterr().err
    assert err.startswith("harness: error: ") and err.count("\n") == 1
    with Store.open(path) as store:
        pass
    assert report_command(path, "latest", tmp_path / "out") == 2  # an empty store
    assert "no runs" in capsys.readouterr().err
    with Store.open(path) as store:
        record_run(store, [])
    assert report_command(path, "r-nope", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "no run 'r-nope'" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
