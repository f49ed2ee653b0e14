"""The vLLM backend without vLLM: server argv, draft export, and the server lifecycle against a stand-in
server launched with the real argv (`python -m vllm.entrypoints.openai.api_server …`). The real engine
is exercised by test_vllm_cross_engine.py (opt-in)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from contracts.backend import BackendError
from backends.vllm.server import draft_location, server_argv, speculative_config
from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from harness.metrics.derive import measure

FAKE = Path(__file__).resolve().parents[1] / "sglang" / "fake_engine_server.py"  # one stand-in for both engines
REPO = Path(__file__).resolve().parents[3]




def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cell(drafter=DrafterSpec("ngram", "ngram"), gamma=3, policy=PolicySpec("full"), **kw) -> Cell:
    return Cell("vllm", TargetSpec("embedded", "embedded", "float32"), drafter, gamma,
                TaskSpec("gsm8k", 3, 12), policy, **({"concurrency": 2} | kw))


DSPARK = DrafterSpec("dspark", "dspark", "embedded:dspark")
DFLASH = DrafterSpec("dflash", "dflash", "embedded:dflash")


# ------------------------------------------------------------------ argv


def _spec(argv):
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_our_drafts_are_exported_to_a_content_addressed_dir(tmp_path):
    options = {"export_dir": str(tmp_path)}
    draft, source = draft_location(_cell(DSPARK), options)
    assert source.endswith("models/embedded/drafts/dspark") and Path(draft).parent == tmp_path
    assert draft == draft_location(_cell(DSPARK), options)[0]  # stable
    assert _spec(server_argv(_cell(DSPARK), options)) == {"method": "dspark", "model": draft, "num_speculative_tokens": 3}
    # our DFlash draft is served exactly as a Qwen3DSparkModel; the DFlash layout only on request
    assert _spec(server_argv(_cell(DFLASH), options))["method"] == "dspark"
    fill_in = _spec(server_argv(_cell(DFLASH), options | {"draft_layout": "dflash"}))
    assert fill_in["method"] == "dflash" and fill_in["model"] != draft_location(_cell(DFLASH), options)[0]
    hub = DrafterSpec("dflash", "dflash", "z-lab/Qwen3-8B-DFlash-b16")
    assert _spec(server_argv(_cell(hub), options)) == {"method": "dflash", "model": "z-lab/Qwen3-8B-DFlash-b16",
                                                       "num_speculative_tokens": 3}


def test_draft_model_is_served_as_it_is(tmp_path):
    """A draft_model checkpoint is a Hugging Face LM: passed to vLLM's draft_model method as resolved (the
    embedded target for `embedded`), never exported, even from a directory that looks like one of our drafts."""
    from inputs import model_refs

    options = {"export_dir": str(tmp_path / "exports")}
    own = _cell(DrafterSpec("self", "draft_model", "embedded"), gamma=5)
    assert _spec(server_argv(own, options)) == {"method": "draft_model", "model": model_refs.resolve("embedded").location,
                                                "num_speculative_tokens": 5}
    assert draft_location(own, options)[1] is None
    hub = _cell(DrafterSpec("small", "draft_model", "Qwen/Qwen3-0.6B"))
    assert _spec(server_argv(hub)) == {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3}
    ours = _cell(DrafterSpec("odd", "draft_model", str(REPO / "models" / "embedded" / "drafts" / "dspark")))
    assert draft_location(ours, options) == (str(REPO / "models" / "embedded" / "drafts" / "dspark"), None)
    with pytest.raises(BackendError, match="DSpark draft"):
        speculative_config(_cell(DrafterSpec("self", "draft_model", "embedded"), policy=PolicySpec("scheduler")))


def test_policies_options_and_flags():
    argv = server_argv(_cell(DSPARK, policy=PolicySpec("scheduler")),
                       {"dspark_draft_topk": 32, "python": "/v/bin/python", "env": ["A=1"], "enforce_eager": True,
                        "max_model_len": 1024, "port": 8100, "draft_layout": "dspark", "timeout_s": 5})
    assert argv[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    spec = _spec(argv)
    assert spec["enable_adaptive_verification"] is True and spec["dspark_draft_topk"] == 32
    assert "--enforce-eager" in argv and argv[argv.index("--max-model-len") + 1] == "1024"
    assert argv[argv.index("--port") + 1] == "8100"
    for adapter_only in ("--env", "--python", "--draft-layout", "--dspark-draft-topk", "--timeout-s"):
        assert adapter_only not in argv
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "detailed"
    assert "--per-request-spec-decode-metrics" not in server_argv(_cell(), {"per_request_spec_decode_metrics": False})
    assert "--speculative-config" not in server_argv(_cell(DrafterSpec("none", "none"), 0))
    for policy, match in [(PolicySpec("threshold", threshold=0.5), "no 'threshold'"), (PolicySpec("budget"), "no 'budget'"),
                          (PolicySpec("static", verify_length=2), "num_drafts")]:
        with pytest.raises(BackendError, match=match):
            speculative_config(_cell(DSPARK, policy=policy))
    with pytest.raises(BackendError, match="DSpark draft"):
        speculative_config(_cell(DFLASH, policy=PolicySpec("scheduler")))
    with pytest.raises(BackendError, match="DSpark drafts only"):
        speculative_config(_cell(), {"dspark_draft_topk": 4})


# ------------------------------------------------------------------ lifecycle against a stand-in


@pytest.fixture
def fake_vllm(tmp_path):
    root = tmp_path / "fake_site"
    target = root / "vllm" / "entrypoints" / "openai" / "api_server.py"
    target.parent.mkdir(parents=True)
    for directory in (root / "vllm", root / "vllm" / "entrypoints", target.parent):
        (directory / "__init__.py").touch()
    shutil.copy(FAKE, target)
    return {"python": sys.executable, "port": _port(), "env": [f"PYTHONPATH={root}"], "startup_timeout_s": 60,
            "export_dir": str(tmp_path / "exports")}


def test_backend_measures_reuses_and_stops_the_server(fake_vllm, data_env):
    from backends.vllm.adapter import VLLMBackend

    backend = VLLMBackend(**fake_vllm)
    try:
        result = measure(backend, _cell())
        assert result.provenance["acceptance_source"] == "per_request"  # the final chunks' metrics block
        assert result.provenance["backend_version"] == "vllm/fake-1.0"
        assert "vllm.entrypoints.openai.api_server" in result.provenance["server_argv"]
        assert all(len(r.output_ids) == 12 for r in result.requests)  # return_token_ids: ids per chunk
        # the stand-in accepts 2, 0, 1, 3, 2 … per step: 12 tokens take 5 steps, 8 accepted, τ = 13/5
        assert result.metrics.value("acceptance_length") == pytest.approx(13 / 5)
        first = backend._server
        second = measure(backend, _cell())  # same argv: the server is kept, counters are scoped to the cell
        assert backend._server is first
        assert second.metrics.value("acceptance_length") == pytest.approx(13 / 5)
        measure(backend, _cell(DrafterSpec("none", "none"), 0))  # another argv: another server
        assert backend._server is not first and not first.running
        last = backend._server
    finally:
        backend.close()
    assert not last.running


def test_backend_exports_our_draft_before_starting(fake_vllm, data_env):
    from backends.vllm.adapter import VLLMBackend

    backend = VLLMBackend(**fake_vllm)
    try:
        result = measure(backend, _cell(DSPARK))
    finally:
        backend.close()
    exported = Path(result.provenance["vllm_draft"])
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["confidence_head_with_markov"] is True
    assert f'"model":"{exported}"' in result.provenance["server_argv"]


def test_failures_carry_the_server_log_tail(fake_vllm, data_env):
    from backends.vllm.adapter import VLLMBackend

    backend = VLLMBackend(**fake_vllm, fail_start=True)
    with pytest.raises(BackendError, match="(?s)did not start.*this configuration is not supported"):
        measure(backend, _cell())
    backend.close()
    rnn = DrafterSpec("dspark-rnn", "dspark", "embedded:dspark-rnn")
    backend = VLLMBackend(**fake_vllm)
    with pytest.raises(BackendError, match="rnn' head has no vLLM counterpart"):
        measure(backend, _cell(rnn))
    backend.close()


def test_unavailable_without_vllm(monkeypatch):
    import importlib.util

    from contracts.backend import BackendUnavailable
    from backends.vllm.adapter import VLLMBackend

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(BackendUnavailable, match="vllm is not installed"):
        VLLMBackend().check(_cell())
    with pytest.raises(BackendUnavailable, match="does not exist"):
        VLLMBackend(python="/nonexistent/python").check(_cell())


@pytest.mark.parametrize("level", [False, "summary"])
def test_prometheus_counters_are_the_fallback(fake_vllm, data_env, level):
    """Without per-step arrays in the responses (the flag left out, or vLLM's `summary` level) acceptance
    comes from the cell's Prometheus counter deltas: the same τ as from the per-request arrays."""
    from backends.vllm.adapter import VLLMBackend

    backend = VLLMBackend(**fake_vllm, per_request_spec_decode_metrics=level)
    try:
        result = measure(backend, _cell())
    finally:
        backend.close()
    assert result.provenance["acceptance_source"] == "prometheus"
    assert all(r.record.num_verified == () for r in result.requests)
    assert result.metrics.value("acceptance_length") == pytest.approx(13 / 5)


def test_per_request_usage_reads_vllms_detailed_block():
    from backends.openai.metrics import per_request_steps
    from backends.vllm.adapter import per_request_usage

    block = {"speculative_decoding": {"mean_acceptance_length": 2.0, "acceptance_histogram": [4, 1, 2, 1],
                                      "num_spec_steps": 8, "num_accepted_draft_tokens": 8, "num_draft_tokens": 24,
                                      "num_spec_tokens": 3, "per_step_accepted": [1, 0, 2, 0, 0, 3, 0, 2],
                                      "per_step_drafted": [3] * 8}}  # as vLLM 0.32 answered on this machine
    usage = per_request_usage(block)
    assert per_request_steps(usage, 3) == (3, (3,) * 8, (1, 0, 2, 0, 0, 3, 0, 2))
    summary = {"speculative_decoding": {k: v for k, v in block["speculative_decoding"].items() if not k.startswith("per_step")}}
    assert per_request_usage(summary) is None and per_request_usage(None) is None
    # a request that never drafted has no arrays at any level: zero steps, not missing data
    none = {"speculative_decoding": {"mean_acceptance_length": 1.0, "acceptance_histogram": [0, 0, 0, 0],
                                     "num_spec_steps": 0, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0,
                                     "num_spec_tokens": 3}}
    assert per_request_steps(per_request_usage(none), 3) == (3, (), ())


def test_the_interpreter_may_come_from_an_environment_variable(monkeypatch, tmp_path):
    """`python_env` names a variable that, when set, overrides `python` (CI and a workstation keep vLLM in
    different places; the suite stays data); unset, `python` applies, then this interpreter."""
    options = {"python": "/opt/vllm/bin/python", "python_env": "DSPARK_TEST_VLLM_PYTHON"}
    monkeypatch.delenv("DSPARK_TEST_VLLM_PYTHON", raising=False)
    assert server_argv(_cell(), options)[0] == "/opt/vllm/bin/python"
    monkeypatch.setenv("DSPARK_TEST_VLLM_PYTHON", str(tmp_path / "venv" / "python"))
    assert server_argv(_cell(), options)[0] == str(tmp_path / "venv" / "python")
    assert server_argv(_cell(), {})[0] == sys.executable
    from contracts.backend import BackendUnavailable
    from backends.vllm.adapter import VLLMBackend

    with pytest.raises(BackendUnavailable, match=r"\$DSPARK_TEST_VLLM_PYTHON .* does not exist"):
        VLLMBackend(**options).check(_cell())
