"""`harness serve`: our OpenAI-compatible HTTP server over the in-house engine.

    python -m backends.inhouse.server --target embedded --drafter-method dspark \\
        --drafter-checkpoint embedded:dspark --num-drafts 3 --port 8000

The engine is the one the in-house backend runs (`backends.inhouse.build.serving_engine`: same loading, policy
and stop tokens), so greedy output through the server equals the in-house backend's for the same prompt ids.
The parts, one concern each, live in `backends.inhouse.serving`: `validation` (an OpenAI body → an engine
request, or a 4xx naming the field), `engine_loop` (the engine thread), `responses` (bodies, chunks, the
spec extension of `usage`), `counters` (/metrics), `app` (aiohttp: routes, limits, timeouts, streaming).

Endpoints: POST /v1/completions (`prompt`: text or token ids) and /v1/chat/completions (`messages`,
through the tokenizer's chat template as `inputs.tasks.tokenize_messages`), streaming (SSE) or not;
GET /health, /v1/models, /version, /metrics (Prometheus text: vLLM's spec-decode counter names, see
`backends.openai.metrics`, plus request, token and connection counters, and vLLM's TTFT histogram
`vllm:time_to_first_token_seconds`, from the POST's arrival to its first token chunk written). Not supported (400): n > 1,
best_of > 1, echo, top_p ≠ 1, penalties, string `stop`; `stop_token_ids` and `ignore_eos` (vLLM's) are. A
request whose client goes away is aborted (`Engine.abort`): its slot is free for the next step, and
/metrics counts it under finished_reason="abort".

Timing: `Engine.step()` admits (prefills) and then runs one speculative step in one call, so a request's
prefill token leaves the server together with its first step's tokens (two chunks, at once): TTFT seen
by a client includes that first step, where the in-house backend's TTFT ends at the prefill.

Start-up errors (bad options, a port in use or out of range, a model or checkpoint that does not load)
are one line on stderr and exit 2; the port is bound before the model loads, so a taken port fails at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import NoReturn

from backends.inhouse.serving.app import Limits, ListenError, Served, ServerThread, listen, serve
from backends.inhouse.serving.counters import Counters
from backends.inhouse.serving.engine_loop import EngineLoop
from backends.inhouse.serving.validation import ModelContext
from contracts.names import DTYPES, HEADS, METHODS, POLICIES, WEIGHTED_METHODS  # the suite's names are the choices

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """Option errors as one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        print(f"harness serve: error: {message} (harness serve --help lists the options)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def load(args: argparse.Namespace):
    """(engine, tokenizer, stop token ids, version) for these options, built as the in-house backend builds a
    cell's engine (`backends.inhouse.build`)."""
    import torch
    import transformers

    from backends.inhouse.build import Models, device_for, serving_engine
    from contracts.cells import DrafterSpec, PolicySpec, TargetSpec

    models = Models(device_for(args.device, args.num_threads))
    built = serving_engine(
        models, TargetSpec("served", args.target, args.dtype),
        DrafterSpec(args.drafter_method, args.drafter_method, args.drafter_checkpoint, args.head), args.num_drafts,
        PolicySpec(args.policy, args.verify_length, args.threshold, args.sps_table),
        temperature=args.policy_temperature, num_slots=args.num_slots, max_context=args.max_context)
    if built.note:
        print(built.note, file=sys.stderr, flush=True)
    version = f"dspark-inhouse/torch-{torch.__version__}/transformers-{transformers.__version__}"
    return built.engine, built.tokenizer, built.stop_token_ids, version


def make_served(engine, tokenizer, stop_token_ids, *, model_name: str = "embedded", version: str = "dspark-inhouse",
                limits: Limits = Limits(), access_log: bool = False) -> Served:
    """The shared state of a server over `engine`, its engine thread started."""
    loop = EngineLoop(engine, Counters(engine.num_drafts)).start()
    model = ModelContext(tokenizer, tuple(stop_token_ids), model_name, engine.config.max_context)
    return Served(loop, model, version, limits, access_log)


def serve_thread(engine, tokenizer, stop_token_ids, *, host: str = "127.0.0.1", port: int = 0,
                 **options) -> ServerThread:
    """A server in this process, on its own thread (`with serve_thread(...) as s:` … `s.port`), for tests."""
    sock = listen(host, port, options.get("limits", Limits()).backlog)
    return ServerThread(make_served(engine, tokenizer, stop_token_ids, **options), sock)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="harness serve", description="Serve the in-house engine over an OpenAI-compatible API.")
    p.add_argument("--target", default="embedded", help="target path, hub id or 'embedded' (default)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--drafter-method", default="none", choices=METHODS)
    p.add_argument("--drafter-checkpoint", default=None,
                   help="draft checkpoint directory or embedded:<draft>; draft_model: a causal LM (or 'embedded')")
    p.add_argument("--head", default=None, choices=HEADS, help="dspark head the checkpoint must have")
    p.add_argument("--num-drafts", type=int, default=None, help="γ (default 3 with a drafter, 0 without)")
    p.add_argument("--policy", default="full", choices=POLICIES)
    p.add_argument("--verify-length", type=int, default=None, help="static: γ' ≤ γ")
    p.add_argument("--threshold", type=float, default=None, help="threshold: σ(c_k) cut-off")
    p.add_argument("--sps-table", default=None,
                   help="scheduler/budget: SPS(B) table JSON; adaptive: a store with step costs (default: profile here)")
    p.add_argument("--policy-temperature", type=float, default=0.0,
                   help="decoding temperature whose STS temperatures calibrate the policy's confidences")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    p.add_argument("--num-slots", type=int, default=64, help="requests decoded together at most")
    p.add_argument("--max-context", type=int, default=2048, help="prompt + output tokens per request")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda if available)")
    p.add_argument("--num-threads", type=int, default=None, help="torch threads")
    p.add_argument("--served-model-name", default=None, help="the `model` clients send (default: --target)")
    p.add_argument("--access-log", action="store_true", help="log every HTTP request to stderr")
    d = Limits()
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="larger request bodies get 413")
    p.add_argument("--read-timeout", type=float, default=d.read_timeout_s, help="seconds a request body may take (408)")
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout_s,
                   help="seconds a connection may wait for its next complete request")
    p.add_argument("--write-timeout", type=float, default=d.write_timeout_s,
                   help="seconds a streaming client may stop reading before its request is aborted")
    p.add_argument("--backlog", type=int, default=d.backlog, help="listen backlog (capped by net.core.somaxconn)")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.num_drafts is None:
        args.num_drafts = 0 if args.drafter_method == "none" else 3
    if args.drafter_method == "none" and args.num_drafts != 0:
        p.error("--num-drafts must be 0 without a drafter")
    if args.drafter_method != "none" and args.num_drafts < 1:
        p.error("--num-drafts must be ≥ 1 with a drafter")
    if args.drafter_method in WEIGHTED_METHODS and not args.drafter_checkpoint:
        p.error(f"--drafter-method {args.drafter_method} needs --drafter-checkpoint")
    if args.policy == "static" and args.verify_length is None:
        p.error("--policy static needs --verify-length")
    if args.policy == "threshold" and args.threshold is None:
        p.error("--policy threshold needs --threshold")
    if args.num_slots < 1 or args.max_context < 2:
        p.error("--num-slots must be ≥ 1 and --max-context ≥ 2")
    if not 0 <= args.port <= 65535:
        p.error(f"--port {args.port} is out of range (0–65535)")
    if args.max_body_bytes < 1024 or args.backlog < 1:
        p.error("--max-body-bytes must be ≥ 1024 and --backlog ≥ 1")
    for name in ("read_timeout", "idle_timeout", "write_timeout"):
        if not 0 < getattr(args, name) < float("inf"):
            p.error(f"--{name.replace('_', '-')} must be a positive number of seconds")


def serve_main(argv: list[str] | None = None) -> int:
    """`harness serve …` / `python -m backends.inhouse.server …`: listen, load, serve until SIGTERM/SIGINT."""
    from contracts.backend import BackendError

    p = parser()
    args = p.parse_args(argv)
    check_args(p, args)
    limits = Limits(args.max_body_bytes, args.read_timeout, args.idle_timeout, args.write_timeout, args.backlog)
    try:
        sock = listen(args.host, args.port, limits.backlog)
    except ListenError as exc:
        print(f"harness serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        engine, tokenizer, stop_ids, version = load(args)
    except Exception as exc:  # noqa: BLE001 — any load failure is a start-up error: one line, exit 2
        sock.close()
        what = str(exc) if isinstance(exc, BackendError) else f"{type(exc).__name__}: {exc}"
        print(f"harness serve: cannot load the model: {_one_line(what)}", file=sys.stderr)
        return EXIT_USAGE
    if args.access_log:  # aiohttp's access logger, one line per request
        logging.getLogger("aiohttp.access").setLevel(logging.INFO)
        logging.basicConfig(stream=sys.stderr, format="%(message)s")
    name = args.served_model_name or args.target
    served = make_served(engine, tokenizer, stop_ids, model_name=name, version=version, limits=limits,
                         access_log=args.access_log)
    host, port = sock.getsockname()[:2]

    async def main() -> None:
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await serve(served, sock, stop, lambda: print(
            f"serving {name} ({args.drafter_method}, γ={args.num_drafts}, policy {args.policy}) on "
            f"http://{host}:{port}", file=sys.stderr, flush=True))

    try:
        asyncio.run(main())
    finally:
        served.loop.stop()
        print("server stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
