"""Fuzz table: `harness serve` argv → the exit code and its one line on stderr (no traceback).

Runs `serve_main` in this process: every row fails before serving, so nothing is left listening.
"""

from __future__ import annotations

import socket

import pytest

from backends.inhouse.server import serve_main


@pytest.fixture(scope="module")
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def broken_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("broken_draft")
    (path / "config.json").write_text("{not json")
    (path / "model.safetensors").write_bytes(b"\x00" * 64)
    return str(path)


# (id, argv, exit code, phrase); {taken} and {broken} are filled from the fixtures
ROWS = [
    ("port in use", ["--port", "{taken}"], 2, "the address is in use"),
    ("port above range", ["--port", "70000"], 2, "out of range"),
    ("port negative", ["--port", "-1"], 2, "out of range"),
    ("port not a number", ["--port", "abc"], 2, "invalid int value"),
    ("unknown option", ["--wizard"], 2, "unrecognized arguments"),
    ("unknown method", ["--drafter-method", "wizard"], 2, "invalid choice"),
    ("drafts without drafter", ["--num-drafts", "2"], 2, "--num-drafts must be 0 without a drafter"),
    ("method without checkpoint", ["--drafter-method", "dspark"], 2, "needs --drafter-checkpoint"),
    ("zero slots", ["--num-slots", "0"], 2, "--num-slots must be ≥ 1"),
    ("read timeout NaN", ["--read-timeout", "nan"], 2, "--read-timeout must be a positive number"),
    ("idle timeout 0", ["--idle-timeout", "0"], 2, "--idle-timeout must be a positive number"),
    ("tiny body limit", ["--max-body-bytes", "10"], 2, "--max-body-bytes must be ≥ 1024"),
    ("missing checkpoint", ["--drafter-method", "dspark", "--drafter-checkpoint", "/nonexistent/draft"], 2,
     "cannot load the model"),
    ("missing target", ["--target", "/nonexistent/target"], 2, "cannot load the model"),
    ("broken checkpoint", ["--drafter-method", "dspark", "--drafter-checkpoint", "{broken}"], 2,
     "cannot load the model"),
]


@pytest.mark.parametrize("argv,code,phrase", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_startup_table(argv, code, phrase, taken_port, broken_checkpoint, capsys):
    argv = [a.format(taken=taken_port, broken=broken_checkpoint) for a in argv]
    try:
        got = serve_main(argv + ["--device", "cpu", "--num-threads", "1"] + ([] if "--port" in argv else ["--port", "0"]))
    except SystemExit as exc:
        got = exc.code
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("harness serve:")]
    assert got == code, err
    assert len(ours) == 1 and phrase in ours[0], err
    assert "Traceback" not in err and len(ours[0]) <= 500
    assert err.rstrip().endswith(ours[0])  # the error is the last thing said
