"""`harness report RUN|latest --out DIR`: one run as a static page, `DIR/index.html` and its PNGs.

Why a folder of files: a CI job uploads it as an artefact and anyone opens `index.html` from disk — no
server, no JavaScript, nothing fetched from the network. Re-running into the same folder replaces the
page and its figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.report.data import load_run
from harness.report.page import render
from harness.report.sections import FIGURE_FILES, build_sections
from harness.store import Store, StoreError


def resolve_run(store: Store, ref: str) -> str:
    """A run id from 'latest' (the newest suite run, whatever its status; else the newest run of any
    kind) or an id; StoreError if there is none."""
    if ref == "latest":
        run_id = store.latest_run(kind="suite", status=None) or store.latest_run(status=None)
        if run_id is None:
            raise StoreError(f"no runs in {store.path}: run a suite first (`harness run`)")
        return run_id
    if store.run(ref) is None:
        raise StoreError(f"no run {ref!r} in {store.path} (`harness query \"SELECT run_id FROM v_runs\"` lists them)")
    return ref


def write_report(store: Store, run_id: str, out: str | Path) -> Path:
    """Write the report of `run_id` into `out` (created); returns the path of index.html."""
    out = Path(out)
    data = load_run(store, run_id)
    out.mkdir(parents=True, exist_ok=True)
    for name in FIGURE_FILES:  # a figure of an earlier report that this one does not draw
        (out / name).unlink(missing_ok=True)
    sections = build_sections(data, out)
    suite = data.run.get("suite_name") or data.run.get("kind")
    page = out / "index.html"
    page.write_text(render(f"{suite} — {run_id}", sections), encoding="utf-8")
    return page


def report_command(db: str | Path, run: str, out: str | Path) -> int:
    """Exit 0 with the page's path on stdout; 2 (one line on stderr) for an unknown run, an unreadable
    store or a folder that cannot be written."""
    try:
        with Store.open(db, read_only=True) as store:
            page = write_report(store, resolve_run(store, run), out)
    except (StoreError, OSError) as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 2
    print(page)
    return 0
