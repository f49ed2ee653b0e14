"""Server backends (vLLM, SGLang) as the runner drives them: one server per server configuration, started for
the largest load its cells need; flags the engine version lacks left out with a note in the cell log; a port
already in use refused; only the process launched taken for the server. Against the stand-in engine
(`sglang/fake_engine_server.py`) launched with the adapters' real argv."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from contracts.backend import BackendError, plan_servers, server_config_key
from backends.engine_version import EngineVersion, Since, engine_version, has, versioned
from backends.process import ServerError, ServerProcess
from fake_engines import FAKE, free_port, install
from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec

NGRAM, PLAIN = DrafterSpec("ngram", "ngram"), DrafterSpec("none", "none")


def _cell(backend="vllm", drafter=NGRAM, gamma=3, **load) -> Cell:
    return Cell(backend, TargetSpec("embedded", "embedded", "float32"), drafter, gamma if drafter is NGRAM else 0,
                TaskSpec("gsm8k", 3, 12), PolicySpec("full"), **(load or {"concurrency": 2}))


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _backend(engine: str, options: dict):
    from backends.sglang.adapter import SGLangBackend
    from backends.vllm.adapter import VLLMBackend

    return {"vllm": VLLMBackend, "sglang": SGLangBackend}[engine](**options)


# ------------------------------------------------------------------ planning (no server)


@pytest.mark.parametrize("engine, load_flag", [("vllm", "--max-num-seqs"), ("sglang", "--max-running-requests")])
def test_cells_differing_only_in_load_share_one_server_started_for_the_largest(engine, load_flag):
    backend = _backend(engine, {"python": sys.executable})
    c1, c8, rate = _cell(engine, concurrency=1), _cell(engine, concurrency=8), _cell(engine, rate=2.0)
    other_task = replace(_cell(engine, concurrency=4), task=TaskSpec("mt_bench", 3, 12))
    plain = _cell(engine, PLAIN, concurrency=1)
    assert server_config_key(backend, c1) == server_config_key(backend, c8) == server_config_key(backend, other_task)
    assert server_config_key(backend, plain) != server_config_key(backend, c1)
    assert _flag(backend.server_argv(c1), load_flag) == "1"  # unplanned: the cell's own load
    plan_servers(backend, [c1, c8, other_task, plain])
    assert {_flag(backend.server_argv(c), load_flag) for c in (c1, c8, other_task)} == {"8"}
    assert backend.server_argv(c1) == backend.server_argv(c8)  # the same argv: the running server is kept
    assert _flag(backend.server_argv(plain), load_flag) == "1"
    plan_servers(backend, [c1, rate])  # an open-loop cell needs the engine's default
    assert _flag(backend.server_argv(c1), load_flag) == "256"


def test_each_start_adds_its_own_served_model_name_to_the_usual_ones():
    plain, named = _backend("vllm", {}), _backend("vllm", {"served_model_name": "qwen"})
    cell = _cell()
    assert plain.identity_flags(cell, "harness-1")[1:] == [plain.server_argv(cell)[4], "harness-1"]  # the --model
    assert named.identity_flags(cell, "harness-1") == ["--served-model-name", "qwen", "harness-1"]
    assert "--served-model-name" not in named.server_argv(cell)  # once, at launch, with this start's name
    assert _backend("sglang", {}).identity_flags(cell, "harness-1") == ["--served-model-name", "harness-1"]


def test_in_process_backends_have_no_server_config():
    from backends.openai.adapter import OpenAIBackend

    backend = OpenAIBackend(base_url="http://127.0.0.1:1")
    assert server_config_key(backend, _cell("openai")) is None
    plan_servers(backend, [_cell("openai")])  # a no-op


# ------------------------------------------------------------------ engine version


def test_a_flag_is_kept_only_for_versions_that_have_it():
    since, notes = Since("0.29.0", "vLLM PR 48915"), []
    flag = "--per-request-spec-decode-metrics"
    assert versioned(flag, ["detailed"], since, EngineVersion("vllm", "py", "0.32.0"), notes) == [flag, "detailed"]
    assert notes == []
    assert versioned(flag, ["detailed"], since, EngineVersion("vllm", "py", "0.28.0"), notes) == []
    assert "vllm 0.28.0 lacks --per-request-spec-decode-metrics (since 0.29.0" in notes[-1]
    assert has(EngineVersion("vllm", "py", "0.29.0rc1"), since) is False  # a pre-release is before its release
    assert has(EngineVersion("vllm", "py", "0.29.0+cpu"), since) is True
    unknown = EngineVersion("vllm", "py", None, "not installed")
    assert versioned(flag, ["detailed"], since, unknown, notes) == [flag, "detailed"] and "unverified" in notes[-1]


def test_the_version_is_asked_of_the_configured_interpreter(tmp_path):
    root = tmp_path / "site"
    install(root, "vllm", "0.28.0")
    assert engine_version(sys.executable, "vllm", (("PYTHONPATH", str(root)),)).version == "0.28.0"
    missing = engine_version(str(tmp_path / "no-python"), "vllm")
    assert missing.version is None and "no interpreter" in missing.problem


@pytest.mark.parametrize("version, has_flag", [("0.28.0", False), ("0.32.0", True)])
def test_a_run_leaves_out_what_the_version_lacks_and_says_so_in_the_cell_log(tmp_path, data_env, version, has_flag):
    backend = _backend("vllm", install(tmp_path / "site", "vllm", version))
    try:
        result = backend.run_cell(_cell())
    finally:
        backend.close()
    assert ("--per-request-spec-decode-metrics" in result.provenance["server_argv"]) is has_flag
    assert result.provenance["acceptance_source"] == ("per_request" if has_flag else "prometheus")
    assert ("lacks --per-request-spec-decode-metrics" in result.log) is not has_flag


# ------------------------------------------------------------------ the server launched, and only it


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_cells_of_one_server_config_run_on_one_start(tmp_path, data_env, engine):
    backend = _backend(engine, install(tmp_path / "site", engine))
    c1, c3 = _cell(engine, concurrency=1), _cell(engine, concurrency=3)
    plan_servers(backend, [c1, c3])
    try:
        backend.run_cell(c1)
        first = backend._server
        assert any(a.startswith("harness-") for a in first.argv)  # this start's own served-model name
        backend.run_cell(c3)
        assert backend._server is first and first.running
    finally:
        backend.close()


def test_a_port_in_use_is_refused_before_starting(tmp_path, data_env):
    options = install(tmp_path / "site", "vllm")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", options["port"]))
        squatter.listen()
        backend = _backend("vllm", options)
        try:
            with pytest.raises(BackendError, match=f"port {options['port']} on 127.0.0.1 is already in use"):
                backend.run_cell(_cell())
            assert backend._server is None  # nothing was launched
        finally:
            backend.close()


def test_a_server_that_answers_but_is_not_the_one_launched_is_refused():
    """Another server answering on the port (one that came up after the port check) fails the identity test."""
    from backends.vllm.adapter import VLLMBackend

    port = free_port()
    backend = VLLMBackend(python=sys.executable, port=port)
    other = subprocess.Popen([sys.executable, str(FAKE), "--port", str(port), "--served-model-name", "someone-else"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not backend._served_names() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert backend._served_names() == ["someone-else"]
        ours = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], f"http://127.0.0.1:{port}/health",
                             startup_timeout_s=30, identify=lambda: "harness-mine" in backend._served_names())
        with pytest.raises(ServerError, match="answers, but not as the process just launched"):
            ours.start()
        assert not ours.running
    finally:
        other.kill()
        other.wait()


# ------------------------------------------------------------------ the GPU suite, planned offline


REPO = Path(__file__).resolve().parents[2]
RELEASED = {"Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B", "deepseek-ai/dspark_qwen3_8b_block7",
            "deepseek-ai/dflash_qwen3_8b_block7", "deepseek-ai/eagle3_qwen3_8b_ttt7", "z-lab/Qwen3-8B-DFlash-b16"}


def test_h100_dry_run_names_released_models_and_starts_each_server_config_once():
    import io

    from harness.runner import dry_run
    from harness.suite import expand, load_suite

    suite = load_suite(REPO / "suites" / "h100.yaml")
    cells = expand(suite)
    assert {m for c in cells for m in (c.target.path, c.drafter.checkpoint) if m} == RELEASED
    out = io.StringIO()
    dry_run(REPO / "suites" / "h100.yaml", out=out)
    text = out.getvalue()
    servers = [line for line in text.splitlines() if line.startswith("server for ")]
    backends = {name: _backend(name, dict(suite.backend_options.get(name, {}))) for name in ("vllm", "sglang")}
    keys = {server_config_key(backends[c.backend], c) for c in cells if c.backend in backends}
    assert len(servers) == len(keys) and not any("unavailable" in line for line in servers)
    assert all("--max-num-seqs 64" in s or "--max-running-requests 64" in s for s in servers)
    dflash = [s for s in servers if "deepseek-ai/dflash_qwen3_8b_block7" in s]
    assert dflash and all('"method":"dspark"' in s or "--speculative-algorithm DSPARK" in s for s in dflash)
    if engine_version(sys.executable, "vllm").version is None:  # no vLLM here: the dry run says so
        assert "warning: vLLM: cannot check flags against the engine version" in text


# Run by a vLLM interpreter: parse each argv (less `python -m module`) with vLLM's own server parser.
_PARSE = r"""
import json, sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
refused = []
for argv in json.load(sys.stdin):
    try:
        make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])
    except SystemExit:
        refused.append(argv)
print(json.dumps(refused))
"""


@pytest.mark.slow
def test_every_h100_vllm_argv_parses_with_the_real_vllm():
    """Opt-in (HARNESS_VLLM_PYTHON: an interpreter with vLLM): vLLM's own parser accepts every server argv
    the GPU suite plans for that version, identity flags included, and refuses a flag it does not know."""
    import json
    import os

    python = os.environ.get("HARNESS_VLLM_PYTHON")
    if not python:
        pytest.skip("set HARNESS_VLLM_PYTHON to an interpreter that has vLLM")
    from backends.vllm.adapter import VLLMBackend
    from harness.suite import expand, load_suite

    suite = load_suite(REPO / "suites" / "h100.yaml")
    cells = [c for c in expand(suite) if c.backend == "vllm"]
    backend = VLLMBackend(**{**suite.backend_options["vllm"], "python": python})
    plan_servers(backend, cells)
    argvs = list({tuple(backend.server_argv(c) + backend.identity_flags(c, "harness-x")): None for c in cells})
    assert backend.engine_version().version is not None and not backend.dry_run_warnings(cells)
    bogus = [*argvs[0], "--no-such-flag"]
    done = subprocess.run([python, "-c", _PARSE], input=json.dumps([*argvs, bogus]), capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [bogus], done.stderr[-2000:]
