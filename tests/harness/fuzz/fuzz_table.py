"""A fuzzing table's row and its one check: the input gives `code`, and stderr (stdout for exit 0) is
exactly one line matching `want` — a substring, or a compiled regex. A new class of bad input is one
more row.

    ROWS = [Row("copy to a file", "COPY (SELECT 1) TO 'x.csv'", 2, "refused: the query reaches a file"), ...]
    @pytest.mark.parametrize("row", ROWS, ids=Row.name_of)
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Pattern

from harness.cli import main

# The stores are built from tests/harness/store's hand-made cells (no model): `store_fixtures`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))

MAX_LINE = 1200  # no error line may be longer: a 1 MB field must not give a 1 MB line


@dataclass(frozen=True)
class Row:
    name: str  # the class of input, as the report lists it
    given: Any  # the statement, the suite text, the file bytes, the argv tail …
    code: int  # the exit code wanted
    want: str | Pattern[str]  # in the one line (substring) or matching it (regex, searched)

    @staticmethod
    def name_of(row: Row) -> str:
        return row.name


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `harness ARGV` run in this process."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def check(row: Row, code: int, out: str, err: str) -> None:
    """The row's exit code, and one line (stderr when failing, else the last stdout line) that matches."""
    assert code == row.code, f"{row.name}: exit {code}, wanted {row.code}; stderr: {err[:500]!r}"
    assert "Traceback" not in err, f"{row.name}: a traceback: {err[:2000]}"
    if row.code == 0:
        text = out.strip()
        assert text, f"{row.name}: no output"
        line = text.splitlines()[-1]
    else:
        assert err.endswith("\n") and err.count("\n") == 1, f"{row.name}: not one line: {err[:800]!r}"
        line = err.rstrip("\n")
        assert len(line) <= MAX_LINE, f"{row.name}: a line of {len(line)} characters"
    found = row.want.search(line if row.code else text) if isinstance(row.want, re.Pattern) \
        else row.want in (line if row.code else text)
    assert found, f"{row.name}: {row.want!r} not in {line[:800]!r}"


# A valid suite, the text a fuzz store's runs carry (the gate re-parses it) and the base of the suite rows.
SUITE = """\
version: 1
name: fuzz
targets:
  embedded: {path: embedded}
drafters:
  dspark: {method: dspark, checkpoint: "embedded:dspark"}
tasks:
  gsm8k: {n_samples: 4, max_new_tokens: 8, temperature: 0}
defaults: {backend: inhouse, warmup: 0, repeats: 1}
matrix:
  target: [embedded]
  drafter: [none, dspark]
  num_drafts: [3]
  task: [gsm8k]
  concurrency: [1]
validity: {min_requests: 2, min_duration_s: 0.0, max_failed_fraction: 0.5}
gates:
  acceptance_length: {direction: higher, test: paired_bootstrap, relative: 0.02, min_samples: 4}
"""


def make_store(path: Path, runs: int = 2) -> list[str]:
    """A store of `runs` finished runs of a plain and a dspark cell (metrics from harness.metrics);
    returns their ids, oldest first."""
    from store_fixtures import make_cell, make_result, run_info

    from harness.store import Store, new_run_id

    t0 = dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc)
    ids = []
    with Store.open(path) as store:
        for i in range(runs):
            started = t0 + dt.timedelta(days=i)
            run_id = store.begin_run(run_info(suite_name="fuzz", suite_text=SUITE), run_id=new_run_id(started),
                                     started_at=started)
            plain = make_result(10 * i, gamma=0)
            for cell, result in ((make_cell("none"), plain), (make_cell("dspark", 3), make_result(10 * i + 1, gamma=3,
                                                                                                  plain=plain))):
                store.record_cell(run_id, cell, 0, result=result, error=None, started_at=started,
                                  finished_at=started + dt.timedelta(seconds=5), comparability_key="k")
            store.finish_run(run_id)
            ids.append(run_id)
    return ids
