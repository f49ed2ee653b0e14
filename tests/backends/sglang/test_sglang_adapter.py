"""The SGLang backend without SGLang: meta_info → per-step counts, the /generate stream, the server
lifecycle against a stand-in server launched with the real argv, and SPS table import.

SGLang has no CPU build; `scripts/gpu_sglang_check.sh` runs the real server on a GPU machine.
"""

from __future__ import annotations

import functools

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest

from contracts.backend import BackendError
from backends.openai.client import ApiRequest, Endpoint, Load, run_openai_load
from backends.sglang.client import astream_generate, generate_body, spec_usage, stream_generate
from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from harness.metrics.derive import measure

FAKE = Path(__file__).resolve().parent / "fake_engine_server.py"
REPO = Path(__file__).resolve().parents[3]




def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ meta_info


def test_spec_usage_from_histogram_and_aliases():
    meta = {"spec_verify_ct": 4, "spec_correct_drafts_histogram": [1, 2, 0, 1], "spec_num_correct_drafts": 5,
            "spec_num_proposed_drafts": 12, "completion_tokens": 10}
    usage = spec_usage(meta, 3)
    assert usage == {"spec_num_drafts": 3, "spec_verify_ct": 4, "spec_accepted_per_step": [0, 1, 1, 3],
                     "spec_verified_per_step": [3, 3, 3, 3]}
    old = {"spec_verify_ct": 2, "spec_accept_histogram": [0, 1, 1], "spec_accept_token_num": 3, "spec_draft_token_num": 4}
    assert spec_usage(old, 2)["spec_accepted_per_step"] == [1, 2]
    assert spec_usage({"completion_tokens": 3}, 3) is None  # plain decoding: no spec fields


@pytest.mark.parametrize("meta,match", [
    ({"spec_verify_ct": 3, "spec_accept_histogram": [1, 1]}, "counts 2 steps"),
    ({"spec_verify_ct": 2, "spec_accept_histogram": [1, 1], "spec_accepted_drafts": 3}, "sums to 1"),
    ({"spec_verify_ct": 2, "spec_accept_histogram": [1, 1], "spec_num_proposed_drafts": 5}, "ragged"),
    ({"spec_verify_ct": 2, "spec_accept_length": 2.5}, "no accept histogram"),
    ({"spec_verify_ct": 1, "spec_accept_histogram": [0, 0, 0, 1]}, "more than"),
])
def test_spec_usage_refuses_inconsistent_meta_info(meta, match):
    with pytest.raises(ValueError, match=match):
        spec_usage(meta, 2)


def test_generate_body_is_sglang_native():
    body = generate_body(ApiRequest("3:0", [5, 6], 16, 0.0, seed=7))
    assert body == {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 16, "temperature": 0.0, "sampling_seed": 7},
                    "stream": True, "rid": "3:0"}


# ------------------------------------------------------------------ against a stand-in server


def _install(tmp_path: Path, package: str, module: str) -> Path:
    """Put the stand-in server where `python -m <package>.<module>` finds it."""
    root = tmp_path / "fake_site"
    target = root / package / (module.replace(".", "/") + ".py")
    target.parent.mkdir(parents=True, exist_ok=True)
    directory = target.parent
    while directory != root:  # every package on the way gets an __init__.py
        (directory / "__init__.py").touch()
        directory = directory.parent
    shutil.copy(FAKE, target)
    return root


@pytest.fixture
def fake_sglang(tmp_path):
    root = _install(tmp_path, "sglang", "launch_server")
    options = {"python": sys.executable, "port": _port(), "env": [f"PYTHONPATH={root}"], "startup_timeout_s": 60}
    return options


def _cell(drafter=DrafterSpec("ngram", "ngram"), gamma=3, **kw) -> Cell:
    return Cell("sglang", TargetSpec("embedded", "embedded", "float32"), drafter, gamma,
                TaskSpec("gsm8k", 3, 12), PolicySpec("full"), **({"concurrency": 2} | kw))


def test_stream_generate_reads_steps_and_tokens(fake_sglang):
    from backends.process import ServerProcess
    from backends.sglang.server import server_argv

    port = fake_sglang["port"]
    argv = server_argv(_cell(), fake_sglang)
    with ServerProcess(argv, f"http://127.0.0.1:{port}/health", env={"PYTHONPATH": fake_sglang["env"][0].split("=", 1)[1]}):
        endpoint = Endpoint(f"http://127.0.0.1:{port}")
        r = stream_generate(endpoint, ApiRequest("0:0", [1, 2, 9], 12, seed=1), num_drafts=3)
        assert r.error is None and r.finish_reason == "length"
        assert r.token_ids == list(range(10, 22)) and r.output_tokens == 12
        # the stand-in accepts 2, 0, 1, 3, 2 …: emissions are 1 (prefill), 3, 1, 2, 4, 1
        assert [n for _, n in r.emissions] == [1, 3, 1, 2, 4, 1]
        record = r.record(num_drafts=3)
        assert sorted(record.num_accepted) == [0, 1, 2, 2, 3] and record.num_verified == (3,) * 5
        responses = run_openai_load(endpoint, [ApiRequest(f"{i}:0", [i], 8) for i in range(4)], Load(concurrency=2),
                                    send=functools.partial(astream_generate, num_drafts=3))
        assert sorted(x.request.request_id for x in responses) == ["0:0", "1:0", "2:0", "3:0"]
        assert all(x.error is None for x in responses)
        bad = stream_generate(Endpoint(f"http://127.0.0.1:{_port()}"), ApiRequest("x", [1], 4))
        assert bad.error is not None and bad.record().failed


def test_backend_runs_cells_reuses_and_stops_the_server(fake_sglang, data_env):
    from backends.sglang.adapter import SGLangBackend

    backend = SGLangBackend(**fake_sglang)
    try:
        result = measure(backend, _cell())
        assert result.provenance["acceptance_source"] == "per_request"
        assert result.provenance["backend_version"] == "sglang/fake-1.0"
        assert result.metrics.value("acceptance_length") > 1 and result.metrics.value("requests") == 3
        records = [r.record for r in result.requests]
        steps = sum(len(r.num_accepted) for r in records)
        accepted = sum(sum(r.num_accepted) for r in records)
        assert result.metrics.value("acceptance_length") == pytest.approx((accepted + steps) / steps)
        first = backend._server
        measure(backend, _cell(concurrency=2, seed=0))  # same argv: the same server
        assert backend._server is first
        plain = measure(backend, _cell(DrafterSpec("none", "none"), 0))  # another argv: a new server
        assert backend._server is not first and not first.running
        assert plain.provenance["acceptance_source"] == "none"
        assert all(r.record.output_tokens == 12 for r in plain.requests)
        server = backend._server
    finally:
        backend.close()
    assert not server.running


def test_failed_start_keeps_the_log_tail(fake_sglang, data_env):
    from backends.sglang.adapter import SGLangBackend

    backend = SGLangBackend(**fake_sglang, fail_start=True)
    with pytest.raises(BackendError, match="(?s)did not start.*this configuration is not supported"):
        measure(backend, _cell())
    backend.close()


def test_openai_endpoint_of_sglang_has_no_meta_info(fake_sglang, data_env):
    """SGLang's OpenAI-compatible streaming carries no spec counts: through the OpenAI client a cell
    has no per-request acceptance (hence the native /generate path)."""
    from backends.openai.adapter import run_cell_at
    from backends.process import ServerProcess
    from backends.sglang.server import server_argv
    from transformers import AutoTokenizer

    from inputs import model_refs

    port = fake_sglang["port"]
    root = fake_sglang["env"][0].split("=", 1)[1]
    with ServerProcess(server_argv(_cell(), fake_sglang), f"http://127.0.0.1:{port}/health", env={"PYTHONPATH": root}):
        tokenizer = AutoTokenizer.from_pretrained(model_refs.resolve("embedded").location)
        result = run_cell_at(Endpoint(f"http://127.0.0.1:{port}", "fake-model"), _cell(), tokenizer=tokenizer,
                             scrape_metrics=False)
    assert result.provenance["acceptance_source"] == "none"
    assert all(not r.record.failed for r in result.requests)


def test_server_argv_drops_adapter_options():
    from backends.sglang.server import server_argv

    argv = server_argv(_cell(), {"python": "/x/python", "port": 31000, "env": ["A=1"], "startup_timeout_s": 5,
                                 "mem_fraction_static": 0.8, "disable_cuda_graph": True})
    assert argv[:3] == ["/x/python", "-m", "sglang.launch_server"]
    assert "--env" not in argv and "--startup-timeout-s" not in argv and "--python" not in argv
    assert argv[argv.index("--port") + 1] == "31000" and "--disable-cuda-graph" in argv
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"


def test_draft_model_is_sglang_standalone():
    """SGLang's name for a separate small causal LM as the draft is STANDALONE, on the same chain flags."""
    from dataclasses import replace

    from backends.sglang.server import server_argv
    from inputs import model_refs

    argv = server_argv(_cell(DrafterSpec("self", "draft_model", "embedded"), 5))
    flags = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--speculative")}
    assert flags == {"--speculative-algorithm": "STANDALONE", "--speculative-num-steps": "5",
                     "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "6",
                     "--speculative-draft-model-path": model_refs.resolve("embedded").location}
    with pytest.raises(BackendError, match="policy 'static' is in-house/vLLM only"):
        server_argv(replace(_cell(DrafterSpec("self", "draft_model", "embedded"), 5),
                            policy=PolicySpec("static", verify_length=2)))


# ------------------------------------------------------------------ SPS tables


def test_floor_table_converts_exactly_to_ceiling_lookup(tmp_path):
    from dspark_core.costs import load_sps_table

    from backends.sglang.sps import import_sps_table

    probes, sps = [4, 8, 16, 64], [100.0, 90.0, 70.0, 30.0]
    src = tmp_path / "dspark_sps.json"
    src.write_text(json.dumps({"sample_batch_tokens": probes, "sample_steps_per_sec": sps, "max_batch_tokens": 96}))
    fp = {"device_name": "NVIDIA H100", "dtype": "bfloat16", "target_id": "Qwen/Qwen3-8B", "context_len": 512}
    out = tmp_path / "ours.json"
    import_sps_table(src, out, fp)
    table = load_sps_table(out, fp)

    def sglang_floor(b):  # SpsCostTable.lookup
        i = max(0, min(sum(p <= b for p in probes) - 1, len(probes) - 1))
        return sps[i]

    assert [table(b) for b in range(1, 97)] == [sglang_floor(b) for b in range(1, 97)]
    other = dict(fp, context_len=1024)
    import_sps_table(src, out, other)  # a second fingerprint is added, the first kept
    assert load_sps_table(out, fp).batch_sizes == table.batch_sizes


def test_additive_table_needs_gamma_and_tabulates_full_verification(tmp_path):
    from backends.sglang.sps import read_sglang_sps

    src = tmp_path / "additive.json"
    src.write_text(json.dumps({"bias_seconds": 0.01, "bs_probes": [1, 8], "alpha_seconds": [0.001, 0.008],
                               "m_probes": [4, 64], "theta_seconds": [0.002, 0.02]}))
    with pytest.raises(ValueError, match="needs --gamma"):
        read_sglang_sps(src)
    sizes, sps, meta = read_sglang_sps(src, gamma=3, max_batch_tokens=16)
    assert sizes == [4, 8, 12, 16] and meta["gamma"] == 3
    # B = 8: 2 requests, budget 6 → M = 8: 0.01 + α(2) + θ(8)
    alpha2 = 0.001 + (2 - 1) / 7 * 0.007
    theta8 = 0.002 + (8 - 4) / 60 * 0.018
    assert sps[1] == pytest.approx(1 / (0.01 + alpha2 + theta8))


def test_sps_cli_refuses_what_is_not_a_table(tmp_path, capsys):
    from backends.sglang.sps import main

    src = tmp_path / "x.json"
    src.write_text('{"foo": 1}')
    assert main([str(src), str(tmp_path / "o.json"), "--device-name", "d", "--dtype", "bf16", "--target-id", "t",
                 "--context-len", "1"]) == 2
    assert "not an SGLang SPS table" in capsys.readouterr().err
