"""Ctrl-C twice: the first stops the run after the cell in flight, the second, wherever it lands (while
the first is handled, while the run is closed, after), stops at once — exit 130, no traceback, the
finished cells kept and the run resumable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuzz_table import SUITE

from harness.store import Store

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("gap_s", [0.0, 0.3], ids=lambda g: f"second after {g}s")
def test_second_ctrl_c_exits_cleanly(gap_s, tmp_path, data_env):
    suite = tmp_path / "s.yaml"
    suite.write_text(SUITE.replace("concurrency: [1]", "concurrency: [1, 2, 3]"))
    db = tmp_path / "h.duckdb"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", str(suite), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[1/"):
            proc.send_signal(signal.SIGINT)
            time.sleep(gap_s)
            proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    text = "".join(lines)
    assert "Traceback" not in text, text[-3000:]
    run_id = lines[0].split()[1].rstrip(":")
    with Store.open(db, read_only=True) as store:
        assert store.run(run_id)["status"] in ("interrupted", "running")  # closed, or stopped while closing
        assert 1 <= len(store.cell_status(run_id)) < 6
