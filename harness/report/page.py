"""The report as one static HTML page: sections of escaped text, tables and PNG images beside it.

Why hand-written HTML: the page has headings, tables and `<img>` tags only — no template engine, no
JavaScript, no stylesheet or font from a CDN — so it opens from a CI artefact or a file share, offline.
Every string that comes from the store (suite names, labels, errors, host fields) passes through
`esc` (or `table`, which escapes each cell), because a suite file or an error message can hold `<`.
"""

from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass
from typing import Any, Sequence

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1400px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: .9em; margin: .5em 0; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.failed td { background: #fdecea; }
pre { background: #f7f7f7; padding: .5em; white-space: pre-wrap; word-break: break-word; margin: 0;
      max-height: 20em; overflow: auto; font-size: .85em; }
.note { color: #666; font-style: italic; } img { max-width: 100%; border: 1px solid #eee; }
nav a { margin-right: 1em; } dl { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; }
dt { font-weight: 600; } dd { margin: 0; }
"""


@dataclass(frozen=True)
class Section:
    anchor: str  # id of the heading (made here, not from the store)
    title: str
    body: str  # HTML, every store string already escaped


def esc(value: Any) -> str:
    """Escaped text of any value (quotes included, so it is safe in attributes too)."""
    return html.escape(fmt(value), quote=True)


def fmt(value: Any) -> str:
    """Plain text of a value: None → '—', floats to 4 significant digits, datetimes to the second."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def note(text: str) -> str:
    """A sentence where a plot would be (missing data); `text` is escaped."""
    return f'<p class="note">{esc(text)}</p>'


def image(filename: str, alt: str) -> str:
    return f'<p><img src="{esc(filename)}" alt="{esc(alt)}"></p>'


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, row_classes: Sequence[str] | None = None,
          pre_columns: Sequence[int] = ()) -> str:
    """An HTML table; numbers right-aligned, columns in `pre_columns` as preformatted text."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for index, row in enumerate(rows):
        cls = f' class="{esc(row_classes[index])}"' if row_classes and row_classes[index] else ""
        cells = []
        for column, value in enumerate(row):
            if column in pre_columns and value:
                cells.append(f"<td><pre>{esc(value)}</pre></td>")
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                cells.append(f'<td class="num">{esc(value)}</td>')
            else:
                cells.append(f"<td>{esc(value)}</td>")
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def definitions(pairs: Sequence[tuple[str, Any]]) -> str:
    """A <dl> of (term, value) pairs, both escaped."""
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs)
    return f"<dl>{items}</dl>"


def render(title: str, sections: Sequence[Section]) -> str:
    """The whole page: a title, a table of contents, the sections in order."""
    nav = "".join(f'<a href="#{esc(s.anchor)}">{esc(s.title)}</a>' for s in sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<nav>{nav}</nav>",
    ]
    for s in sections:
        parts.append(f'<section id="{esc(s.anchor)}"><h2>{esc(s.title)}</h2>\n{s.body}\n</section>')
    parts.append("</body></html>\n")
    return "\n".join(parts)
