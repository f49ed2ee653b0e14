"""The load-time checks agree with what they stand for: the backend option rules with the adapters'
own options, and the gate-able metric names with what `harness.metrics.summarise` records."""

from __future__ import annotations

import inspect

from harness.suite import backend_options, metric_names


def test_inhouse_and_openai_options_are_the_adapters_own():
    from backends.inhouse.adapter import InhouseBackend
    from backends.openai.adapter import OPTIONS

    params = [p for p in inspect.signature(InhouseBackend.__init__).parameters if p not in ("self", "unknown")]
    assert sorted(backend_options.OPTIONS["inhouse"]) == sorted(params)
    assert sorted(backend_options.OPTIONS["openai"]) == sorted(OPTIONS)


def test_server_backends_type_only_their_adapter_options():
    from backends.sglang.server import ADAPTER_OPTIONS as SGLANG
    from backends.vllm.server import ADAPTER_OPTIONS as VLLM

    assert set(backend_options.OPTIONS["vllm"]) <= set(VLLM)
    assert set(backend_options.OPTIONS["sglang"]) <= set(SGLANG)


def test_metric_names_come_from_summarise_not_the_fallback():
    names = metric_names._synthetic_names()  # raises if the synthetic case stopped building
    assert {"acceptance_length", "ece_calibrated", "speedup", "goodput", "ttft_p99", "step_time_p50"} <= names
    for name in names | metric_names.FALLBACK:
        assert metric_names.known_metric(name), name
    assert metric_names.known_metric("position_acceptance_conditional_k32")
    assert not metric_names.known_metric("position_acceptance_conditional_k33")
    assert not metric_names.known_metric("acceptance_lenght")
