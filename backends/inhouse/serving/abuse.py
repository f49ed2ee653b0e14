"""A load and abuse check of `harness serve`, loopback only, bounded, stopping by itself.

    python -m backends.inhouse.serving.abuse --clients 50 200 --stalled 100      # starts its own server

It starts `python -m backends.inhouse.server` (the embedded target, plain decoding) on a free loopback port
and reports, as one JSON object:
  - `concurrent[n]`: n clients that connect at the same instant and each POST a short completion —
    answers by status, and connection resets/refusals (wanted: all 200, zero resets);
  - `stalled`: n uploads that declare a body and stop sending — how many got 408 and when, and the server's
    threads and open connections before, during and after (wanted: every one 408 within the read timeout
    plus a margin, threads flat, connections back to the baseline);
  - `idle`: a connection that sends half a request line — seconds until the server closes it (wanted: about
    the idle timeout);
  - `huge`: a declared 4 GB body — the status and seconds to it (wanted: 413 at once);
  - `bad`: bad requests, each followed by a /metrics scrape — whether received = failed + finished +
    in flight held after every one.
The functions take (host, port) and serve the test at small scale (tests/backends/serve_fuzz).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OK_BODY = {"prompt": [3, 17, 42], "max_tokens": 4, "temperature": 0}
BAD_BODIES: tuple[bytes, ...] = (
    b'{"prompt": ""}', b'{"prompt": [3], "temperature": NaN}', b'{"prompt": [3], "temperature": 1e308}',
    b'{"prompt": [3], "stream": true, "stream_options": "yes"}', b'{"prompt": [3], "max_tokens": 1000000}',
    b'{"model": "other", "prompt": [3]}', b'{"prompt": [3', b'\xff\xfe', b'[' * 5000,
)
BAD_CHATS: tuple[bytes, ...] = (
    b'{"messages": [{"role": 5, "content": "hi"}]}', b'{"messages": [{"role": "user", "content": 5}]}',
)
RESETS = (ConnectionResetError, ConnectionRefusedError, BrokenPipeError, ConnectionAbortedError,
          http.client.RemoteDisconnected)


def post(host: str, port: int, path: str, body: bytes, timeout_s: float = 60.0) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, {"raw": data.decode("utf-8", "replace")[:200]}
    finally:
        conn.close()


def metrics(host: str, port: int) -> dict[str, float]:
    """The request counters and gauges of /metrics, summed over labels: name (without prefix) → value."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            key = name.split("{", 1)[0].split(":", 1)[1]
            out[key] = out.get(key, 0.0) + float(value)
    return out


def consistent(m: dict[str, float]) -> bool:
    """received = failed + finished + in flight."""
    return m["requests_received_total"] == (m["requests_failed_total"] + m.get("request_success_total", 0.0)
                                            + m["requests_in_flight"])


def concurrent_clients(host: str, port: int, n: int, timeout_s: float = 120.0) -> dict:
    """n clients connect at one instant (a barrier), each POSTs OK_BODY; statuses and resets counted."""
    barrier, results, lock = threading.Barrier(n), {"resets": 0, "errors": 0, "status": {}}, threading.Lock()
    body = json.dumps(OK_BODY).encode()

    def client() -> None:
        try:
            barrier.wait(timeout=30)
            status, _ = post(host, port, "/v1/completions", body, timeout_s)
            with lock:
                results["status"][status] = results["status"].get(status, 0) + 1
        except RESETS:
            with lock:
                results["resets"] += 1
        except Exception:  # noqa: BLE001 — a timeout or anything else: counted, never raised
            with lock:
                results["errors"] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 35)
    results["seconds"] = round(time.monotonic() - start, 2)
    return results


def _threads(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def stalled_uploads(host: str, port: int, n: int, read_timeout_s: float, pid: int | None = None) -> dict:
    """n connections declare a 1000-byte body, send 10 bytes and stop. Each should get 408 after about the
    read timeout; the server's threads stay flat and its connections fall back to the baseline."""
    base = metrics(host, port)["http_connections"]
    threads_before = _threads(pid)
    socks, start = [], time.monotonic()
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=read_timeout_s + 30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"prompt\":")
        socks.append(s)
    time.sleep(min(read_timeout_s / 2, 2.0))
    during = {"connections": metrics(host, port)["http_connections"] - base, "threads": _threads(pid)}
    answered, latest = {}, 0.0
    for s in socks:
        try:
            head = s.recv(200).split(b"\r\n", 1)[0].decode("latin-1")
            status = head.split(" ")[1] if head.startswith("HTTP/") else head or "closed"
        except OSError as exc:
            status = type(exc).__name__
        latest = max(latest, time.monotonic() - start)
        answered[status] = answered.get(status, 0) + 1
        s.close()
    deadline = time.monotonic() + 10
    while True:  # the server closes its side shortly after answering (lingering)
        after = metrics(host, port)["http_connections"] - base
        if after <= 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {"answered": answered, "last_answer_s": round(latest, 2), "during": during,
            "after": {"connections": after, "threads": _threads(pid)}, "threads_before": threads_before}


def idle_connection(host: str, port: int, idle_timeout_s: float) -> dict:
    """A connection that sends half a request line and nothing more: seconds until the server closes it."""
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=idle_timeout_s + 30) as s:
        s.sendall(b"POST /v1/comp")
        try:
            data = s.recv(200)
        except OSError as exc:
            data = type(exc).__name__.encode()
    return {"closed_after_s": round(time.monotonic() - start, 2), "answer": data[:40].decode("latin-1")}


def huge_declared(host: str, port: int) -> dict:
    """Headers that declare a 4 GB body, and no body: the status line and the seconds to it."""
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 4294967296\r\n\r\n")
        head = s.recv(200).split(b"\r\n", 1)[0].decode("latin-1")
    return {"status": head, "seconds": round(time.monotonic() - start, 3)}


def bad_requests(host: str, port: int) -> dict:
    """Each bad body, then a scrape: the statuses, and after how many the counters did not add up."""
    statuses, broken = [], []
    for path, bodies in (("/v1/completions", BAD_BODIES), ("/v1/chat/completions", BAD_CHATS)):
        for body in bodies:
            status, answer = post(host, port, path, body)
            statuses.append((status, (answer.get("error") or {}).get("param")))
            m = metrics(host, port)
            if not consistent(m) or m["requests_in_flight"] != 0:
                broken.append(body[:40].decode("latin-1"))
    return {"statuses": statuses, "inconsistent_after": broken, "count": len(statuses)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    from backends.process import ServerProcess

    p = argparse.ArgumentParser(prog="python -m backends.inhouse.serving.abuse", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[50, 200])
    p.add_argument("--stalled", type=int, default=100)
    p.add_argument("--read-timeout", type=float, default=5.0)
    args = p.parse_args(argv)
    port = _free_port()
    argv_server = [sys.executable, "-m", "backends.inhouse.server", "--port", str(port), "--device", "cpu",
                   "--num-threads", "1", "--num-slots", "64", "--max-context", "256",
                   "--read-timeout", str(args.read_timeout), "--idle-timeout", str(4 * args.read_timeout)]
    report: dict = {"server": " ".join(argv_server[1:])}
    with ServerProcess(argv_server, f"http://127.0.0.1:{port}/health", cwd=REPO, startup_timeout_s=300) as server:
        pid = server.pgid  # the server is its group's leader
        report["concurrent"] = {n: concurrent_clients("127.0.0.1", port, n) for n in args.clients}
        report["stalled"] = stalled_uploads("127.0.0.1", port, args.stalled, args.read_timeout, pid)
        report["idle"] = idle_connection("127.0.0.1", port, 4 * args.read_timeout)
        report["huge"] = huge_declared("127.0.0.1", port)
        report["bad"] = bad_requests("127.0.0.1", port)
        report["metrics"] = {k: v for k, v in metrics("127.0.0.1", port).items() if k.startswith(("request", "http"))}
        report["metrics_consistent"] = consistent(metrics("127.0.0.1", port))
    print(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
