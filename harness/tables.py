"""Query results on the terminal: an aligned text table, CSV, JSON (one object per row) or a Markdown table
(for a CI step summary or a pull request)."""

from __future__ import annotations

import csv
import json
import math
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Sequence, TextIO


def _json_value(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(_json_value(value))


def write_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, out: TextIO) -> None:
    if fmt == "json":
        json.dump([{c: _json_value(v) for c, v in zip(columns, row)} for row in rows], out, indent=1)
        out.write("\n")
    elif fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows([[_cell(v) for v in row] for row in rows])
    elif fmt == "table":
        text = [list(columns)] + [[_cell(v) for v in row] for row in rows]
        widths = [max(len(r[i]) for r in text) for i in range(len(columns))]
        for i, row in enumerate(text):
            out.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")
            if i == 0:
                out.write("  ".join("-" * w for w in widths) + "\n")
        out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")
    elif fmt == "markdown":
        out.write(markdown_table(columns, [[_cell(v) for v in row] for row in rows]))
    else:
        raise ValueError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")


FORMATS = ("table", "csv", "json", "markdown")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """A GitHub-flavoured Markdown table; `|` in values escaped, numbers (or `right` columns) right-aligned."""
    def esc(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    if right is None:
        right = [bool(rows) and all(_numeric(r[i]) for r in rows if r[i] != "") for i in range(len(columns))]
    lines = ["| " + " | ".join(esc(c) for c in columns) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _numeric(text: str) -> bool:
    try:
        float(str(text).replace("−", "-").rstrip("%×"))
        return True
    except ValueError:
        return False
