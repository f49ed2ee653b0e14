"""A `GateReport` for people and for CI: text (the "why" of each verdict on one line), markdown (a step
summary: the verdict up top, then a table) and JUnit XML (one testcase per cell × metric, so CI systems
show regressions as failing tests and inconclusive comparisons as skipped ones).

Changes read baseline → candidate: relative ones as percentages, absolute ones (ECE) in the metric's unit;
"detectable" is the minimum detectable effect (80% power at the rule's α), the size of change this
comparison could have caught.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from harness.gate.report import Comparison, ExitCode, GateReport
from harness.gate.stats import Estimate

FORMATS = ("text", "markdown", "junit")
_ORDER = {"regression": 0, "improvement": 1, "invalid": 2, "unstable": 3, "inconclusive": 4, "pass": 5,
          "incomparable": 6}
_ICON = {"regression": "❌", "improvement": "🟢", "invalid": "⛔", "unstable": "〰", "inconclusive": "❔", "pass": "✅",
         "incomparable": "↔️"}


def _minus(text: str) -> str:
    return text.replace("-", "−")


def num(x: float | None) -> str:
    """A metric value: three significant digits, whole numbers from 1000 on (no exponents for tokens/s)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return _minus(f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}")


def change(x: float | None, scale: str) -> str:
    """A signed change: +1.2% (relative) or +0.0041 (absolute); ±∞ for an unbounded interval end."""
    if x is not None and math.isinf(x):
        return "+∞" if x > 0 else "−∞"
    if x is None or not math.isfinite(x):
        return "n/a"
    return _minus(f"{100 * x:+.1f}%" if scale == "relative" else f"{x:+.3g}")


def _magnitude(x: float, scale: str) -> str:
    return change(x, scale).lstrip("+")


def _ci(est: Estimate) -> str | None:
    if est.ci is None:
        return None
    return f"{change(est.ci[0], est.scale)}…{change(est.ci[1], est.scale)}"


def _detectable(est: Estimate) -> str | None:
    if est.mde is None:
        return None
    return "nothing detectable at this n" if not math.isfinite(est.mde) else _magnitude(est.mde, est.scale)


def _tag(c: Comparison) -> str:
    return "REGRESSION (warn)" if c.verdict == "regression" and not c.blocking else c.verdict.upper()


def comparison_line(c: Comparison) -> str:
    """One comparison on one line, e.g.

    `REGRESSION acceptance_length  <cell>: 3.42 → 3.18 (−7.0%, 95% CI −9.1%…−4.8%, p=0.001, detectable ≥ 1.2%, n=50)`
    """
    head = f"{_tag(c):<12} {c.metric}  {c.label}"
    est = c.estimate
    if est is None:
        return f"{head}: {c.reason}"
    parts = [change(est.effect, est.scale)]
    if est.ci is not None:
        parts.append(f"{100 * (1 - est.alpha):g}% CI {_ci(est)}")
    if est.p_value is not None:
        parts.append(f"p={est.p_value:.2g}")
    else:
        parts.append("threshold")
    detectable = _detectable(est)
    if detectable is not None:
        parts.append(f"detectable ≥ {detectable}" if math.isfinite(est.mde) else detectable)
    parts.append(f"n={est.n}")
    return f"{head}: {num(est.baseline)} → {num(est.candidate)} ({', '.join(parts)})"


def _sorted(report: GateReport) -> list[Comparison]:
    return sorted(report.comparisons, key=lambda c: (_ORDER[c.verdict], not c.blocking, c.label, c.metric))


def to_text(report: GateReport, verbose: bool = True) -> str:
    """The summary, then every problem and comparison with its reason; `verbose=False` drops the passes."""
    lines = [report.summary]
    lines += [f"INVALID      {reason}" for reason in report.validity.reasons]
    for f in report.failed_cells:
        error = (f.error.strip().splitlines() or ["(no error message)"])[-1]
        lines.append(f"FAILED CELL  {f.label} (repeats {', '.join(map(str, f.repeats))}): {error}")
    for c in _sorted(report):
        if c.verdict == "pass" and not verbose:
            continue
        lines.append(comparison_line(c))
        if c.estimate is not None and (c.verdict != "pass" or "underpowered" in c.reason):
            lines.append(f"             why: {c.reason}")
        if c.estimate is not None and c.estimate.note and c.verdict != "pass":
            lines.append(f"             note: {c.estimate.note}")
    for m in report.unmatched:
        lines.append(f"NO BASELINE  {m.label}: {'; '.join(m.reasons)}")
    lines += [f"NOTE         {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: GateReport) -> str:
    """A one-line verdict, then one table row per comparison (regressions first) and the cells not judged."""
    icon = {ExitCode.OK: "✅", ExitCode.REGRESSION: "❌", ExitCode.INVALID: "⛔", ExitCode.NO_BASELINE: "❔"}
    out = [f"{icon[report.exit_code]} **{_md(report.summary)}**", ""]
    if report.validity.reasons:
        out += ["Invalid run:", ""] + [f"- {_md(r)}" for r in report.validity.reasons] + [""]
    if report.failed_cells:
        out += ["Failed cells:", ""]
        out += [f"- `{_md(f.label)}` (repeats {', '.join(map(str, f.repeats))}): {_md(f.error.strip()[-200:])}"
                for f in report.failed_cells] + [""]
    if report.comparisons:
        out.append("| verdict | metric | cell | baseline | candidate | change | CI | p | detectable | n | why |")
        out.append("|---|---|---|---:|---:|---:|---|---:|---:|---:|---|")
        for c in _sorted(report):
            est = c.estimate
            warn = " (warn)" if c.verdict == "regression" and not c.blocking else ""
            verdict = f"{_ICON[c.verdict]} {c.verdict}{warn}"
            if est is None:
                cells = ["", "", "", "", "", "", ""]
            else:
                cells = [num(est.baseline), num(est.candidate), change(est.effect, est.scale), _ci(est) or "",
                         "" if est.p_value is None else f"{est.p_value:.2g}", _detectable(est) or "", str(est.n)]
            out.append("| " + " | ".join([verdict, f"`{c.metric}`", _md(c.label), *cells, _md(c.reason)]) + " |")
        out.append("")
    if report.unmatched:
        out += ["Cells without a comparable baseline:", ""]
        out += [f"- `{_md(m.label)}`: {_md('; '.join(m.reasons))}" for m in report.unmatched] + [""]
    out += [f"> {_md(note)}" for note in report.notes]
    return "\n".join(out).rstrip() + "\n"


def to_junit(report: GateReport) -> str:
    """JUnit XML: a testcase per cell × metric (failure: fail-level regression; skipped: inconclusive), one
    per failed cell (failure), per cell without baseline (skipped) and one for the run's validity."""
    suite = ET.Element("testsuite", name=f"harness gate {report.candidate_run} vs {report.baseline_run}")

    def case(classname: str, name: str) -> ET.Element:
        return ET.SubElement(suite, "testcase", classname=classname, name=name, time="0")

    validity = case("run", "validity")
    if report.validity.reasons:
        failure = ET.SubElement(validity, "failure", type="invalid", message="the run cannot be judged")
        failure.text = "\n".join(report.validity.reasons)
    for f in report.failed_cells:
        failure = ET.SubElement(case(f.label, "cell"), "failure", type="failed-cell",
                                message=f"cell failed in repeats {', '.join(map(str, f.repeats))}")
        failure.text = f.error
    for c in _sorted(report):
        tc = case(c.label, c.metric)
        line = comparison_line(c)
        if c.blocking:
            ET.SubElement(tc, "failure", type="regression", message=line).text = c.reason
        elif c.verdict in ("inconclusive", "unstable", "invalid", "incomparable"):
            ET.SubElement(tc, "skipped", message=f"{c.verdict}: {c.reason}")
        else:
            ET.SubElement(tc, "system-out").text = f"{line}\n{c.reason}"
    for m in report.unmatched:
        ET.SubElement(case(m.label, "baseline"), "skipped", message="no comparable baseline: " + "; ".join(m.reasons))

    cases = suite.findall("testcase")
    counts = {
        "tests": len(cases),
        "failures": sum(tc.find("failure") is not None for tc in cases),
        "errors": 0,
        "skipped": sum(tc.find("skipped") is not None for tc in cases),
    }
    suite.attrib.update({k: str(v) for k, v in counts.items()})
    root = ET.Element("testsuites", name="harness gate", **{k: str(v) for k, v in counts.items()})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def render(report: GateReport, fmt: str = "text") -> str:
    if fmt == "text":
        return to_text(report)
    if fmt == "markdown":
        return to_markdown(report)
    if fmt == "junit":
        return to_junit(report)
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
