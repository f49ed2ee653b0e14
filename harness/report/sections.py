"""The report's sections, each from `RunData` to HTML (and its PNG, written into the report folder).

Each section says why it is empty instead of failing: a run without a confidence head has no
reliability diagram, one without a plain-decoding cell no speedup, one with a single γ a τ-vs-γ plot of
single points, a first run of a suite no history. The sections and their sources:

    run           runs / v_runs / v_cells: suite, git, host, packages, timing, cells ok/failed and errors
    acceptance    v_acceptance ⋈ cells: τ vs γ, one panel per task, one line per drafter
    positions     v_positions ⋈ cells: α_k and β_k per drafter at its largest γ
    calibration   calibration_bins (per position): reliability diagrams raw and calibrated per drafter, with
                  per-bin counts and Wilson intervals; the one ECE (harness.metrics.confidence) beside them
    pareto        v_metrics: per task, tokens/s per user against total tokens/s, one line per drafter × γ ×
                  policy and plain decoding, a point per load: the trade-off speculative decoding moves
    load          v_metrics, v_speedup: throughput, user_speed_p50 and speedup vs concurrency (and rate)
    latency       v_metrics: TTFT p50 and TPOT p50 vs load, with the suite's SLA as lines
    history       v_metrics over runs of the suite: τ of this run's cells, step fit and change points
    summary       cells ⋈ metrics ⋈ v_speedup: every cell's key metrics
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from harness.report import figures, reliability
from harness.report.data import HISTORY_METRIC, SUMMARY_METRICS, RunData
from harness.report.figures import Line, Panel
from harness.report.history import describe_change, series
from harness.report.page import Section, definitions, fmt, image, note, table

FIGURE_FILES = ("acceptance.png", "positions.png", "calibration.png", "pareto.png", "load_concurrency.png",
                "load_rate.png", "latency_concurrency.png", "latency_rate.png", "history.png")
BARS = "bars: smallest to largest repeat"


def build_sections(data: RunData, out: Path) -> list[Section]:
    """Every section in page order; figures are written into `out`."""
    builders: Sequence[Callable[[RunData, Path], Section]] = (
        run_section, acceptance_section, positions_section, calibration_section, pareto_section, load_section,
        latency_section, history_section, summary_section,
    )
    return [build(data, out) for build in builders]


# ---------------------------------------------------------------------------------------------- run


def run_section(data: RunData, out: Path) -> Section:
    run = data.run
    dirty = run.get("git_dirty")
    pairs = [
        ("suite", run.get("suite_name")),
        ("suite file", run.get("suite_path")),
        ("suite hash", run.get("suite_hash")),
        ("run id", run["run_id"]),
        ("kind / status", f"{run.get('kind')} / {run.get('status')}"),
        ("label", run.get("label")),
        ("git", f"{run.get('git_sha') or '—'} on {run.get('git_branch') or '—'}"
                + (" (dirty: uncommitted changes)" if dirty else "" if dirty is False else " (dirty: unknown)")),
        ("host fingerprint", run.get("host_fingerprint")),
        ("started (UTC)", run.get("started_at")),
        ("finished (UTC)", run.get("finished_at")),
        ("duration", _duration(run.get("duration_s"))),
        ("repeats", run.get("repeats")),
        ("metadata", _plain(_metadata(run.get("metadata"))) if run.get("metadata") else None),
        ("cells ok / failed", f"{run.get('cells_ok', 0)} / {run.get('cells_failed', 0)}"),
        ("command", " ".join(str(a) for a in run.get("argv") or []) or None),
    ]
    body = [definitions([(k, v) for k, v in pairs if v is not None])]
    host = run.get("host") or {}
    if host:
        body.append("<h3>Host</h3>" + definitions([(k, _plain(v)) for k, v in sorted(host.items())]))
    packages = run.get("packages") or {}
    if packages:
        rows = [(k, _plain(v)) for k, v in sorted(packages.items())]
        body.append("<h3>Packages</h3>" + table(["package", "version"], rows))
    failed = [c for c in data.cells if c["status"] == "failed"]
    if failed:
        body.append(f"<h3>Failed cells ({len(failed)})</h3>")
        body.append(table(["cell", "repeat", "cell id", "error"],
                          [(c["label"], c["repeat"], c["cell_id"], c["error"] or "(no error recorded)")
                           for c in failed],
                          pre_columns=(3,)))
    elif data.cells:
        body.append(note("Every cell succeeded."))
    else:
        body.append(note("This run recorded no cells."))
    return Section("run", "Run", "\n".join(body))


# ------------------------------------------------------------------------------------- acceptance


def acceptance_section(data: RunData, out: Path) -> Section:
    title = "Acceptance length τ vs γ"
    rows = [r for r in data.tau if r["tau"] is not None]
    if not rows:
        return Section("acceptance", title, note(
            "No succeeded speculative cell with verify steps in this run, so there is no τ to plot."))
    axes = _varying(rows, ("policy", "temperature", "target", "backend"))
    panels: dict[str, Panel] = {}
    for r in rows:
        panel = panels.setdefault(r["task"], Panel(f"task {r['task']}", "γ (drafts per step)", "τ (tokens per step)",
                                                   integer_x=True, dodge=True))
        label = _line_label(r["drafter"], r, axes)
        line = panel.lines.setdefault(label, Line([], [], lo=[], hi=[]))
        line.xs.append(r["num_drafts"])
        line.ys.append(r["tau"])
        line.lo.append(r.get("tau_lo"))
        line.hi.append(r.get("tau_hi"))
    body = [image(_save(figures.panel_grid(list(panels.values())), out, "acceptance.png"),
                  "acceptance length against the number of drafts, per task and drafter")]
    gammas = sorted({r["num_drafts"] for r in rows})
    if len(gammas) == 1:
        body.append(note(f"Only γ = {gammas[0]} was measured, so each drafter is a single point; "
                         "τ vs γ needs a suite with several num_drafts."))
    body.append(note("τ counts the bonus token: (accepted drafts + steps) / steps, pooled over the loads, "
                     f"seeds and repeats of each point (v_acceptance); {BARS} (each pooled over its loads)."))
    return Section("acceptance", title, "\n".join(body))


# -------------------------------------------------------------------------------------- positions


def positions_section(data: RunData, out: Path) -> Section:
    title = "Per-position acceptance"
    rows = [r for r in data.positions if r["verified"]]
    if not rows:
        return Section("positions", title, note(
            "No verified draft positions in this run (no succeeded speculative cell)."))
    alpha = Panel("unconditional α_k = accepted_k / verified_k", "draft position k", "acceptance", integer_x=True, dodge=True,
                  ylim=(0, 1.02))
    beta = Panel("conditional β_k = accepted_k / reached_k", "draft position k", "acceptance", integer_x=True, dodge=True,
                 ylim=(0, 1.02))
    axes = _varying(rows, ("policy", "target", "backend"))
    for r in rows:
        label = _line_label(f"{r['drafter']} (γ{r['gamma']})", r, axes)
        for panel, column, interval in ((alpha, "unconditional", "alpha"), (beta, "conditional", "beta")):
            line = panel.lines.setdefault(label, Line([], [], lo=[], hi=[]))
            line.xs.append(r["position"])
            line.ys.append(r[column])
            line.lo.append(r.get(f"{interval}_lo"))
            line.hi.append(r.get(f"{interval}_hi"))
    body = [
        image(_save(figures.panel_grid([alpha, beta], ncols=2), out, "positions.png"),
              "per-position acceptance, unconditional and conditional, per drafter"),
        note("Each drafter and policy at its largest γ, pooled over tasks, loads and repeats (v_positions); policies "
             "are kept apart (a policy that verifies fewer drafts changes who reaches position k); bars: 95% "
             "Wilson intervals on the count the conversations are worth (`stats.clustered_wilson`, as the model "
             "card's: a conversation's steps are not independent, and rounds that replay one another count once). α_k: draft k "
             "accepted among steps that verified it; β_k: among steps that reached it (drafts 1 … k−1 accepted)."),
    ]
    return Section("positions", title, "\n".join(body))


# ------------------------------------------------------------------------------------ calibration


def _interval(bounds: tuple[float, float] | None) -> str | None:
    return None if bounds is None else f"[{bounds[0]:.3g}, {bounds[1]:.3g}]"


def calibration_section(data: RunData, out: Path) -> Section:
    title = "Reliability diagram (ECE)"
    rows = [r for r in data.calibration if r["count"]]
    axes = _varying(rows, ("target", "backend"))
    by_drafter: dict[str, dict[str, list[reliability.Bin]]] = {}
    for r in rows:
        bin_ = reliability.Bin(r["position"], r["bin"], r["lower"], r["upper"], r["count"], r["confidence_sum"],
                               r["outcome_sum"])
        by_drafter.setdefault(_line_label(r["drafter"], r, axes), {}).setdefault(r["kind"], []).append(bin_)
    if not by_drafter:
        return Section("calibration", title, note(
            "No calibration bins in this run: no drafter with a confidence head succeeded, "
            "so there is no reliability diagram."))
    panels, table_rows, missing = [], [], []
    for drafter, kinds in sorted(by_drafter.items()):
        for kind in ("raw", "calibrated"):
            if kinds.get(kind):
                panels.append((f"{drafter} {kind}", kinds[kind]))
        if not kinds.get("calibrated"):
            missing.append(drafter)
        per_position = {kind: reliability.position_ece(bins) for kind, bins in kinds.items()}
        intervals = {kind: reliability.ece_interval(kinds.get(kind, [])) for kind in ("raw", "calibrated")}
        table_rows.append((
            drafter, reliability.ece(kinds.get("raw", [])), _interval(intervals["raw"]),
            reliability.ece(kinds.get("calibrated", [])), _interval(intervals["calibrated"]),
            *(reliability.mean_gap(kinds.get(kind, [])) for kind in ("raw", "calibrated")),
            sum(b.count for b in kinds.get("raw", [])),
            *(", ".join(f"k{j} {fmt(e)}" for j, (e, _) in per_position.get(kind, {}).items())
              for kind in ("raw", "calibrated")),
        ))
    body = [
        image(reliability.save(reliability.figure(panels), out / "calibration.png").name,
              "reliability diagrams per draft position, raw and calibrated confidences, per drafter, "
              "with per-bin counts"),
        table(["drafter", "ECE raw", "95% CI", "ECE calibrated", "95% CI", "mean gap raw", "mean gap calibrated",
               "observed draft positions",
               "ece_position_raw", "ece_position_calibrated"], table_rows),
        note("ECE = Σ|Σ confidence − Σ outcome| / Σ count over the bins of every draft position, each position "
             "binned on its own: the metric ece_raw / ece_calibrated of the summary and the gate, here over the "
             "drafter's cells pooled (bin sums, then one division). Per-position terms are ece_position_*. "
             "95% CI: a binomial bootstrap over the bins (each bin's outcomes redrawn from Binomial(count, observed "
             "accuracy), basic interval, which removes the absolute value's upward bias once, so it may lie below the "
             "ECE shown, which carries that bias; bins as independent; "
             "reliability.ece_interval has its measured coverage). "
             "Mean gap: Σ(confidence − outcome) / Σ count over the same bins, signed (> 0: the confidences promise "
             "more acceptance than the verifier gives); close to the ECE, the miscalibration is a level shift, which "
             "one temperature per position barely moves. "
             "Points: observed survival with its 95% Wilson interval; bars: the cycles in each bin."),
    ]
    if missing:
        body.append(note(f"No calibrated (STS) bins for {', '.join(missing)}: only the raw curve is shown."))
    return Section("calibration", title, "\n".join(body))


# ------------------------------------------------------------------------------------------- load

LOAD_PANELS = (
    ("throughput", "throughput (output tokens/s)"),
    ("user_speed_p50", "per-user speed p50 (tokens/s/user)"),
    ("speedup", "speedup over plain decoding (×)"),
)
LATENCY_PANELS = (("ttft_p50", "TTFT p50 (ms)", "ttft_s"), ("tpot_p50", "TPOT p50 (ms)", "tpot_s"))
LOAD_AXES = (("concurrency", "concurrency (closed loop)"), ("rate", "request rate (requests/s, open loop)"))


def _series_name(r: dict, axes: Sequence[str]) -> tuple[str, bool]:
    """(line label, plain?) of a load row: plain decoding, or drafter γ policy (and the varying axes)."""
    plain = r["method"] == "none"
    name = "plain" if plain else f"{r['drafter']} γ{r['num_drafts']}"
    return _line_label(name, r, axes if plain else ("policy", *axes)), plain


def _add_point(panel: Panel, label: str, plain: bool, x, r: dict, column: str, factor: float = 1.0) -> None:
    line = panel.lines.setdefault(label, Line([], [], key=label, dashed=plain, lo=[], hi=[], reference=plain))
    scaled = [r.get(k) * factor if r.get(k) is not None else None for k in (column, f"{column}_lo", f"{column}_hi")]
    line.xs.append(x)
    line.ys.append(scaled[0])
    line.lo.append(scaled[1])
    line.hi.append(scaled[2])


def _load_grid(rows: list[dict], axis: str, axis_label: str, columns, axes, hlines=None) -> list[Panel]:
    panels = []
    for task in dict.fromkeys(r["task"] for r in rows):
        for column, ylabel, *sla_key in columns:
            empty = ("no plain-decoding cell at these loads, so no speedup" if column == "speedup" else "no data")
            factor = 1e3 if ylabel.endswith("(ms)") else 1.0
            lines = tuple(hlines(sla_key[0]) if hlines and sla_key else ())
            if column == "speedup":
                lines = ((1.0, "1× = plain decoding"),)
            panel = Panel(f"task {task}: {ylabel.split(' (')[0]}", axis_label, ylabel, empty=empty, log2_x=True,
                          dodge=True, hlines=lines)
            for r in (r for r in rows if r["task"] == task):
                label, plain = _series_name(r, axes)
                if plain and column == "speedup":
                    continue
                _add_point(panel, label, plain, r[axis], r, column, factor)
            panels.append(panel)
    return panels


def load_section(data: RunData, out: Path) -> Section:
    title = "Throughput and per-user speed vs load"
    rows = [r for r in data.load if r["throughput"] is not None or r["user_speed_p50"] is not None]
    if not rows:
        return Section("load", title, note("No succeeded cell with throughput or per-user speed in this run."))
    axes = _varying(rows, ("temperature", "target", "backend"))
    body = []
    for axis, axis_label in LOAD_AXES:
        axis_rows = [r for r in rows if r[axis] is not None]
        if not axis_rows:
            continue
        filename = _save(figures.panel_grid(_load_grid(axis_rows, axis, axis_label, LOAD_PANELS, axes), ncols=3), out,
                         f"load_{axis}.png")
        body.append(image(filename, f"throughput, per-user speed and speedup against {axis}, per task"))
    if not body:
        return Section("load", title, note("No cell of this run has a concurrency or a rate."))
    if not any(r["method"] == "none" for r in rows):
        body.append(note("This run has no plain-decoding cell, so speculative decoding has nothing to be compared "
                         "with: no plain line and no speedup."))
    body.append(note("Lines: plain decoding (black, dashed) and each drafter × γ × verification policy (static, "
                     f"scheduler, …); points are means over repeats (v_metrics), {BARS}; series are set slightly "
                     "apart sideways so equal values stay visible; speedup pairs each cell with plain decoding of "
                     "the same run, task and load (v_speedup)."))
    return Section("load", title, "\n".join(body))


# ----------------------------------------------------------------------------------------- pareto


def pareto_section(data: RunData, out: Path) -> Section:
    title = "Per-user speed vs throughput (Pareto)"
    rows = [r for r in data.load if r["throughput"] is not None and r["user_speed_p50"] is not None]
    if not rows:
        return Section("pareto", title, note("No succeeded cell with both throughput and per-user speed."))
    axes = _varying(rows, ("temperature", "target", "backend"))
    panels = []
    for task in dict.fromkeys(r["task"] for r in rows):
        panel = Panel(f"task {task}", "throughput (output tokens/s, all users)", "per-user speed p50 (tokens/s/user)")
        for r in sorted((r for r in rows if r["task"] == task), key=lambda r: (r["concurrency"] or 0, r["rate"] or 0)):
            label, plain = _series_name(r, axes)
            line = panel.lines.setdefault(label, Line([], [], key=label, dashed=plain, lo=[], hi=[], xlo=[], xhi=[],
                                                      tags=[], reference=plain))
            line.tags.append(f"c{r['concurrency']}" if r["concurrency"] is not None else f"r{r['rate']:g}")
            line.xs.append(r["throughput"])
            line.ys.append(r["user_speed_p50"])
            line.lo.append(r["user_speed_p50_lo"])
            line.hi.append(r["user_speed_p50_hi"])
            line.xlo.append(r["throughput_lo"])
            line.xhi.append(r["throughput_hi"])
        panels.append(panel)
    body = [
        image(_save(figures.panel_grid(panels, ncols=2), out, "pareto.png"),
              "per-user speed against total throughput, per task, one line per drafter, γ and policy"),
        note("Each line walks the loads of one configuration (closed-loop concurrency, then open-loop rate, low to "
             "high): up is faster for each user, right is more tokens for the machine. A speculative line above and "
             "right of plain decoding (black, dashed) wins at that load (c: concurrency, r: request rate beside each point); where it falls below, the drafts cost more than "
             f"they save. Points are means over repeats, {BARS} in both directions."),
    ]
    return Section("pareto", title, "\n".join(body))


# ---------------------------------------------------------------------------------------- latency


def latency_section(data: RunData, out: Path) -> Section:
    title = "TTFT and TPOT vs load"
    rows = [r for r in data.load if r["ttft_p50"] is not None or r["tpot_p50"] is not None]
    if not rows:
        return Section("latency", title, note("No succeeded cell with TTFT or TPOT in this run."))
    axes = _varying(rows, ("temperature", "target", "backend"))
    sla = data.sla

    def hlines(key: str):
        return [(sla[key] * 1e3, f"SLA {sla[key] * 1e3:g} ms")] if key in sla else []

    body = []
    for axis, axis_label in LOAD_AXES:
        axis_rows = [r for r in rows if r[axis] is not None]
        if axis_rows:
            grid = _load_grid(axis_rows, axis, axis_label, LATENCY_PANELS, axes, hlines)
            body.append(image(_save(figures.panel_grid(grid, ncols=2), out, f"latency_{axis}.png"),
                              f"median time to first token and time per output token against {axis}, per task"))
    if not body:
        return Section("latency", title, note("No cell of this run has a concurrency or a rate."))
    shown = ", ".join(f"{k.removesuffix('_s').upper()} ≤ {v * 1e3:g} ms" for k, v in sla.items())
    body.append(note((f"Red dashed lines: the suite's SLA ({shown}). " if sla else
                      "The suite declares no `sla:`, so no SLA line is drawn. ") +
                     f"Medians over each cell's measured requests, then means over repeats; {BARS}."))
    return Section("latency", title, "\n".join(body))


# ---------------------------------------------------------------------------------------- history


def history_section(data: RunData, out: Path) -> Section:
    title = f"History of {HISTORY_METRIC}"
    suite = data.run.get("suite_name")
    if not data.history:
        return Section("history", title, note(
            f"No {HISTORY_METRIC} for this run's cells in the store" + (f" (suite {suite})." if suite else
                                                                        " (the run has no suite name).")))
    run_order = list(dict.fromkeys((r.started_at, r.run_id) for r in data.history))
    if len(run_order) < 2:
        return Section("history", title, note(
            f"This is the only run of suite {suite} with {HISTORY_METRIC} so far; the history starts with the "
            "next one."))
    position = {run_id: i for i, (_, run_id) in enumerate(run_order)}
    all_series = series(data.history)
    plotted = [
        (s.label, [position[r.run_id] for r in s.rows], [r.value for r in s.rows], list(s.fit.levels),
         [c.index for c in s.fit.changes])
        for s in all_series
    ]
    sha = {r.run_id: (r.git_sha or "")[:7] for r in data.history}
    run_labels = [f"{started:%m-%d %H:%M}" + (f" {sha[run_id]}" if sha.get(run_id) else "")
                  if hasattr(started, "strftime") else run_id for started, run_id in run_order]
    fig = figures.history_figure(plotted, run_labels, HISTORY_METRIC)
    body = [image(_save(fig, out, "history.png"),
                  f"{HISTORY_METRIC} of this run's cells over the runs of suite {suite}, with change points")]
    changes = [
        (s.label, s.cell_id, s.rows[c.index].run_id, s.rows[c.index].started_at, (s.rows[c.index].git_sha or "")[:10],
         describe_change(c))
        for s in all_series for c in s.fit.changes
    ]
    if changes:
        body.append(table(["cell", "cell id", "first run at the new level", "started (UTC)", "git sha", "change"],
                          changes))
    else:
        body.append(note("No change point: every cell stays at one level."))
    body.append(note(
        f"{len(run_order)} runs of suite {suite} up to this one, {len(all_series)} cells; one point per run "
        "(mean over repeats). Circles, dotted lines and the dashed step fit mark change points "
        "(harness/report/changepoints.py). `harness history` prints the same numbers."))
    return Section("history", title, "\n".join(body))


# ---------------------------------------------------------------------------------------- summary


def summary_section(data: RunData, out: Path) -> Section:
    title = "Summary"
    if not data.summary:
        return Section("summary", title, note("This run recorded no cells."))
    headers = ["cell", "repeat", "status"] + [heading for _, heading, _ in SUMMARY_METRICS]
    rows, classes = [], []
    for r in data.summary:
        values = [r[name] * factor if r[name] is not None else None for name, _, factor in SUMMARY_METRICS]
        rows.append([r["label"], r["repeat"], r["status"], *values])
        classes.append("failed" if r["status"] == "failed" else "")
    body = [
        table(headers, rows, row_classes=classes),
        note("τ: acceptance length (bonus included); speedup: over plain decoding of the same run (— when there "
             "is none); ECE: raw and STS-calibrated, each draft position binned on its own, count-weighted (the "
             "one definition the gate and the reliability diagrams use); TTFT / TPOT: medians over the window's "
             "requests."),
    ]
    return Section("summary", title, "\n".join(body))


# ------------------------------------------------------------------------------------------ helpers


AXIS_FORMATS = {"policy": "{}", "temperature": "T{:g}", "target": "@{}", "backend": "[{}]"}


def _varying(rows: Sequence[dict], axes: Sequence[str]) -> list[str]:
    """The axes among `axes` that take more than one value in `rows`: the ones a line label must name."""
    return [axis for axis in axes if len({r[axis] for r in rows}) > 1]


def _line_label(name: str, row: dict, axes: Sequence[str]) -> str:
    """`name` followed by the row's value of each axis, e.g. 'dspark γ4 scheduler T0.7 @qwen3-8b'."""
    parts = [name] + [AXIS_FORMATS[axis].format(row[axis]) for axis in axes if row[axis] is not None]
    return " ".join(parts)


def _save(fig, out: Path, filename: str) -> str:
    figures.save(fig, out / filename)
    return filename


def _duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    minutes, secs = divmod(float(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)}h {int(minutes):02d}m {secs:04.1f}s" if hours else f"{int(minutes)}m {secs:04.1f}s"


def _metadata(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _plain(value) -> str:
    """A JSON value from the host/package stamps as one line of text."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return fmt(value)

