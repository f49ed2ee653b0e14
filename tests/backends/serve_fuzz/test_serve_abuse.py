"""The load and abuse check (`backends.inhouse.serving.abuse`) at small scale against an in-process server:
simultaneous clients get answers and no resets; stalled uploads get 408 after the read timeout and hold no
thread or connection afterwards; a declared 4 GB body is refused at once; /metrics adds up after every bad
request. The full-scale numbers (50 and 200 clients, 100 stalled uploads) come from running the module."""

from __future__ import annotations

import threading

from backends.inhouse.serving import abuse


def test_simultaneous_clients_are_all_answered(served):
    result = abuse.concurrent_clients("127.0.0.1", served.port, 24, timeout_s=120)
    assert result["resets"] == 0 and result["errors"] == 0 and result["status"] == {200: 24}, result


def test_stalled_uploads_time_out_and_free_everything(served):
    timeout = served.served.limits.read_timeout_s
    threads = threading.active_count()
    result = abuse.stalled_uploads("127.0.0.1", served.port, 12, timeout)
    assert result["answered"] == {"408": 12}, result
    assert result["during"]["connections"] >= 12 and result["after"]["connections"] <= 0, result
    assert result["last_answer_s"] < timeout + 10, result
    assert threading.active_count() <= threads  # asyncio: a stalled client never held a thread


def test_a_declared_4gb_body_is_refused_at_once(served):
    result = abuse.huge_declared("127.0.0.1", served.port)
    assert result["status"].startswith("HTTP/1.1 413") and result["seconds"] < served.served.limits.read_timeout_s, result


def test_counters_add_up_after_every_bad_request(served):
    result = abuse.bad_requests("127.0.0.1", served.port)
    assert result["inconsistent_after"] == [] and all(400 <= s < 500 for s, _ in result["statuses"]), result


def test_an_idle_connection_is_closed(served):
    idle = served.served.limits.idle_timeout_s
    result = abuse.idle_connection("127.0.0.1", served.port, idle)
    assert idle - 0.5 <= result["closed_after_s"] < idle + 10 and result["answer"] == "", result
