"""Client-measured TTFT against the server's own, on `harness serve` under closed-loop load.

    HARNESS_DATA_DIR=../shared/datasets python3 -m benchmarks.ttft_agreement --concurrency 64 [--rounds 3]
        [--requests-per-slot 2] [--max-new-tokens 16] [--drafter none|dspark]

Starts our OpenAI server (`python -m backends.inhouse.server`, `--num-slots` = concurrency) once and runs
the `openai` backend's cell against it `--rounds` times: GSM8K first turns, `concurrency` streams in
flight. Per round it prints the client's TTFT (mean, p50, p90: from just before a request is sent to the
arrival of its first token chunk, `backends.openai.client`) and the server's (`ttft_server_mean`: the
server's `vllm:time_to_first_token_seconds` histogram, POST arrival to first chunk written, over the same
measured phase), and their gap — what the client itself adds. A measurement tool, not a test; the machine
is shared, so read the gap per round, not one absolute figure.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ttft_agreement", description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--drafter", choices=("none", "dspark"), default="none")
    args = parser.parse_args(argv)
    os.environ.setdefault("HARNESS_DATA_DIR", str(REPO.parent / "shared" / "datasets"))

    from backends.openai.adapter import OpenAIBackend
    from backends.process import ServerProcess
    from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
    from harness.metrics.derive import measure

    c, port = args.concurrency, _free_port()
    argv_server = [sys.executable, "-m", "backends.inhouse.server", "--port", str(port), "--num-slots", str(c),
                   "--num-threads", "1", "--device", "cpu", "--served-model-name", "embedded"]
    drafter, gamma = DrafterSpec("none", "none"), 0
    if args.drafter == "dspark":
        checkpoint = "models/embedded/drafts/dspark"
        argv_server += ["--drafter-method", "dspark", "--drafter-checkpoint", checkpoint, "--num-drafts", "3"]
        drafter, gamma = DrafterSpec("dspark", "dspark", checkpoint), 3
    cell = Cell("openai", TargetSpec("embedded", "embedded"), drafter, gamma,
                TaskSpec("gsm8k", args.requests_per_slot * c + 1, args.max_new_tokens), PolicySpec("full"),
                concurrency=c, warmup=1)
    server = ServerProcess(argv_server, f"http://127.0.0.1:{port}/health", cwd=REPO, startup_timeout_s=300).start()
    backend = OpenAIBackend(base_url=f"http://127.0.0.1:{port}")
    print(f"harness serve, {args.drafter}, concurrency {c}, {args.requests_per_slot * c} measured streams per round")
    print(f"{'round':>5} {'client mean':>12} {'client p50':>11} {'client p90':>11} {'server mean':>12} {'gap':>9} {'gap %':>6}")
    try:
        for i in range(args.rounds):
            m = measure(backend, cell).metrics
            client, srv = m.value("ttft_mean"), m.value("ttft_server_mean")
            gap = client - srv
            print(f"{i:>5} {client * 1e3:>9.1f} ms {m.value('ttft_p50') * 1e3:>8.1f} ms {m.value('ttft_p90') * 1e3:>8.1f} ms "
                  f"{srv * 1e3:>9.1f} ms {gap * 1e3:>6.1f} ms {gap / srv:>6.1%}")
    finally:
        backend.close()
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
