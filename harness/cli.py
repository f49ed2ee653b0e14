"""The `harness` command. Thin: one small function per verb over plain functions that tests call.

    harness init [PATH]                          (a commented starter suite; docs/SUITES.md has every key)
    harness run SUITE.yaml [--db PATH] [--only AXIS=VALUE …] [--dry-run] [--resume RUN_ID]
                           [--seed N] [--n-samples N] [--concurrency N …] [--rate RPS …] [--repeats N]
                           [--label NAME] [--metadata KEY=VALUE …] [--quiet] [--no-progress]
                           [--executor local|ray [--address ADDR]]
    harness run --endpoint URL --model NAME [--task gsm8k …]   (an existing OpenAI-compatible server)
    harness query [--db PATH] [--format table|csv|json|markdown] "SQL"
    harness gate [--db PATH] [--run RUN|latest] [--baseline RUN|latest|BRANCH|FILE.json] [--format …] [--output FILE]
    harness compare RUN_A RUN_B [--all] [--format table|markdown|csv|json] · harness history METRIC [--where SQL]
    harness report RUN --out DIR · harness audit SUITE.yaml [--db PATH] · harness ingest FILE
    harness baseline export|import …
    harness export RUN… --parquet DIR · harness import DIR   (a history pooled from many machines)
    harness serve [--target …] [--drafter-method …] [--port …]   (OpenAI-compatible server, in-house engine)

Exit codes: 0 ok · 1 regression or failed cells · 2 invalid input or invalid run · 3 no comparable
baseline · 130 interrupted (finish with --resume).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_DB = Path("results") / "harness.duckdb"
DB_ENV = "HARNESS_DB"


def _db_default() -> Path:
    return Path(os.environ.get(DB_ENV, DEFAULT_DB))


def _quiet_libraries() -> None:
    """Model loading prints progress bars and hub warnings into the run's own display."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _error(message: str, code: int = 2) -> int:
    print(f"harness: error: {message}", file=sys.stderr)
    return code


# ----------------------------------------------------------------------------------------------- run


def cmd_run(args) -> int:
    from harness.runner import RunError, dry_run, run_suite

    _quiet_libraries()
    try:
        overrides, label, metadata = run_overrides(args)
        suite_path = args.suite if args.suite is not None else Path("<endpoint>")
        suite = _warn_unpaired(suite_path, args.only, overrides)
        if args.dry_run:
            return dry_run(suite_path, args.only, None, db_path=args.db, overrides=overrides)
        from harness.progress import display_for, run_context

        display = display_for(quiet=args.quiet, no_progress=args.no_progress, context=run_context(args.db, suite.name))
        from harness.executors import get_executor

        if args.address is not None and args.executor != "ray":
            raise RunError("--address needs --executor ray")
        executor = get_executor(args.executor, **({"address": args.address} if args.executor == "ray" else {}))
        outcome = run_suite(suite_path, db_path=args.db, only=args.only, resume=args.resume, display=display,
                            argv=sys.argv, executor=executor, overrides=overrides, label=label, metadata=metadata)
    except RunError as exc:
        return _error(str(exc))
    return outcome.exit_code


def run_overrides(args):
    """(Overrides, label, metadata) from `harness run`'s flags; RunError for a bad combination."""
    from harness.overrides import Overrides, endpoint_suite
    from harness.runner import RunError

    metadata = {}
    for item in args.metadata:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise RunError(f"--metadata takes KEY=VALUE, got {item!r}")
        metadata[key.strip()] = value
    suite_text = None
    if args.endpoint is not None:
        if args.suite is not None:
            raise RunError("give a suite file or --endpoint, not both")
        if not args.model:
            raise RunError("--endpoint needs --model NAME (the model the server serves)")
        suite_text = endpoint_suite(args.endpoint, args.model, args.task or ["gsm8k"], tokenizer=args.tokenizer,
                                    chat=args.chat)
    elif args.suite is None:
        raise RunError("give a suite file (harness init writes a starter) or --endpoint URL --model NAME")
    elif args.model or args.task or args.tokenizer or args.chat:
        raise RunError("--model, --task, --tokenizer and --chat go with --endpoint (a suite names its own)")
    overrides = Overrides(seed=args.seed, n_samples=args.n_samples, max_new_tokens=args.max_new_tokens,
                          concurrency=tuple(args.concurrency), rate=tuple(args.rate), repeats=args.repeats,
                          suite_text=suite_text)
    return (overrides if overrides else None), args.label, metadata


def _warn_unpaired(suite_path, only, overrides):
    """The suite, after one warning line if speculative cells have no plain-decoding cell to compare with."""
    from harness.progress import unpaired_warning
    from harness.runner import load_cells

    suite, cells = load_cells(suite_path, only, check_files=False, overrides=overrides)
    warning = unpaired_warning(cells)
    if warning:
        print(f"harness: warning: {suite_path}: {warning}", file=sys.stderr)
    return suite


def cmd_init(args) -> int:
    from harness.starter import write_starter

    return write_starter(args.path, force=args.force)


def cmd_audit(args) -> int:
    from harness.audit import run_audit
    from harness.runner import RunError

    _quiet_libraries()
    import inspect

    extra = {"db_path": args.db} if "db_path" in inspect.signature(run_audit).parameters else {}
    try:
        return run_audit(args.suite, only=args.only, samples=args.samples, **extra)
    except RunError as exc:
        return _error(str(exc))


# --------------------------------------------------------------------------------------------- query


def cmd_query(args) -> int:
    from harness.store import StoreError, read_only_query
    from harness.tables import write_table

    try:
        columns, rows = read_only_query(args.db, args.sql)
    except StoreError as exc:
        return _error(str(exc))
    write_table(columns, rows, args.format, sys.stdout)
    return 0


def cmd_gate(args) -> int:
    from harness.gate.command import gate_command

    return gate_command(args.db, run=args.run, baseline=args.baseline, fmt=args.format, output=args.output,
                        suite=args.suite)


def cmd_compare(args) -> int:
    from harness.gate.command import compare_command

    return compare_command(args.db, args.run_a, args.run_b, metrics=args.metric, fmt=args.format, show_all=args.all)


def cmd_history(args) -> int:
    from harness.report.history import history_command

    return history_command(args.db, args.metric, where=args.where, fmt=args.format)


def cmd_report(args) -> int:
    from harness.report import report_command

    return report_command(args.db, args.run, args.out)


def cmd_ingest(args) -> int:
    from harness import provenance
    from harness.store import RunInfo, Store, StoreError, ingest_benchmark_json

    try:
        with Store.open(args.db) as store:
            host = provenance.host_info()
            sha, branch, dirty = provenance.git_info(Path.cwd())
            info = RunInfo(suite_name=Path(args.file).stem, suite_path=str(args.file), suite_text="", suite_hash="",
                           git_sha=sha, git_branch=branch, git_dirty=dirty,
                           host_fingerprint=provenance.host_fingerprint(host), host=host,
                           packages=provenance.package_versions(), argv=sys.argv, repeats=1, kind="benchmark")
            run_id = ingest_benchmark_json(store, args.file, info)
    except (StoreError, OSError, ValueError) as exc:
        return _error(str(exc))
    print(run_id)
    return 0


def cmd_baseline(args) -> int:
    from harness.store import Store, StoreError, export_run, import_run

    try:
        if args.action == "export":
            with Store.open(args.db, read_only=True) as store:
                run_id = _resolve_run(store, args.run)
                export_run(store, run_id, args.file, compact=args.compact)
            print(f"exported {run_id} → {args.file}")
        else:
            with Store.open(args.db) as store:
                print(import_run(store, args.file, label=args.label))
    except StoreError as exc:
        return _error(str(exc))
    return 0


def cmd_export(args) -> int:
    from harness.store import Store, StoreError, export_parquet

    try:
        with Store.open(args.db, read_only=True, sandbox=False) as store:  # the one verb that writes files
            run_ids = [_resolve_run(store, ref) for ref in args.runs]
            files = export_parquet(store, run_ids, args.parquet)
    except StoreError as exc:
        return _error(str(exc))
    print(f"exported {len(run_ids)} run(s), {len(files)} files → {args.parquet}")
    return 0


def cmd_import(args) -> int:
    from harness.store import Store, StoreError, import_parquet

    try:
        with Store.open(args.db) as store:
            imported, skipped = import_parquet(store, args.dir)
    except StoreError as exc:
        return _error(str(exc))
    for run_id in imported:
        print(run_id)
    print(f"imported {len(imported)} run(s), {len(skipped)} already in the store", file=sys.stderr)
    return 0


def _resolve_run(store, ref: str) -> str:
    from harness.store import StoreError

    run_id = store.latest_run() if ref == "latest" else ref
    if run_id is None or store.run(run_id) is None:
        raise StoreError(f"no run {ref!r} in the store")
    return run_id


def cmd_serve(args) -> int:
    from backends.inhouse.server import serve_main

    _quiet_libraries()
    return serve_main(args.rest)


# ------------------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description="Declarative benchmarks and regression gates "
                                     "for DSpark speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def db_arg(p, help_text="result store (default: $HARNESS_DB or results/harness.duckdb)"):
        p.add_argument("--db", type=Path, default=_db_default(), help=help_text)

    p = sub.add_parser("run", help="run a suite's cells into the store")
    p.add_argument("suite", type=Path, nargs="?", help="suite YAML file (docs/SUITES.md; `harness init` writes one)")
    db_arg(p)
    add_run_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("init", help="write a commented starter suite that runs as it is on the embedded default")
    p.add_argument("path", type=Path, nargs="?", default=Path("suite.yaml"), help="where to write it (default: suite.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("audit", help="losslessness audit: speculative cells against plain decoding")
    p.add_argument("suite", type=Path, help="suite YAML file whose speculative cells are audited")
    db_arg(p, "result store the audit reads measured acceptance from to size its samples, where it does "
              "(default: $HARNESS_DB or results/harness.duckdb)")
    p.add_argument("--only", action="append", default=[], metavar="AXIS=VALUE",
                   help="keep cells whose AXIS equals VALUE (as for run)")
    p.add_argument("--samples", type=int, default=None, help="sampled requests per cell for the χ² test")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("query", help="read-only SQL over the result history")
    db_arg(p)
    p.add_argument("--format", choices=("table", "csv", "json", "markdown"), default="table")
    p.add_argument("sql", help="one SELECT over the store's views (harness/store/VIEWS.md), e.g. "
                               "\"select * from v_runs\"")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("gate", help="compare a run with a baseline; exit 1 on a regression")
    db_arg(p)
    p.add_argument("--run", default="latest", help="candidate run id or 'latest' (default)")
    p.add_argument("--baseline", default="latest",
                   help="run id, 'latest' (the run before --run), a branch name, or an exported baseline .json")
    p.add_argument("--suite", type=Path, default=None, help="take gates from this suite file instead of the run's")
    p.add_argument("--format", choices=("text", "markdown", "junit"), default="text")
    p.add_argument("--output", type=Path, help="write the report here (stdout otherwise)")
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("compare", help="two runs side by side")
    db_arg(p)
    p.add_argument("run_a", help="baseline run id or 'latest'")
    p.add_argument("run_b", help="candidate run id or 'latest'")
    p.add_argument("--metric", action="append", default=None, help="metrics to show (repeatable)")
    p.add_argument("--all", action="store_true", help="every (cell, metric) row, not only the most important")
    p.add_argument("--format", choices=("table", "csv", "json", "markdown"), default="table")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("history", help="one metric over the run history, with change points")
    db_arg(p)
    p.add_argument("metric", help="a metric name, e.g. acceptance_length, throughput, ttft_p50")
    p.add_argument("--where", default=None, help="SQL condition over v_metrics columns, e.g. \"task = 'gsm8k'\"")
    p.add_argument("--format", choices=("table", "csv", "json", "markdown"), default="table")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("report", help="static HTML report with plots")
    db_arg(p)
    p.add_argument("run", help="run id or 'latest'")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("ingest", help="load a pytest-benchmark JSON file into the store")
    db_arg(p)
    p.add_argument("file", type=Path, help="pytest-benchmark JSON file (pytest --benchmark-json)")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("baseline", help="export a run as a baseline file, or import one")
    db_arg(p)
    p.add_argument("action", choices=("export", "import"), help="export a run to FILE, or import FILE")
    p.add_argument("file", type=Path, help="the baseline JSON file")
    p.add_argument("--run", default="latest", help="export: run id or 'latest'")
    p.add_argument("--label", default=None, help="import: a name for the imported run")
    p.add_argument("--compact", action="store_true",
                   help="export: leave out per-token times and engine steps (a gate baseline does not need them)")
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("export", help="runs as parquet files (one per table and run), to pool with other machines")
    db_arg(p)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run ids or 'latest'")
    p.add_argument("--parquet", type=Path, required=True, metavar="DIR", help="directory to write DIR/<table>/<run>.parquet")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="load the runs of a parquet export directory the store lacks (idempotent)")
    db_arg(p)
    p.add_argument("dir", type=Path, help="a directory written by harness export --parquet")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("serve", help="the in-house engine behind an OpenAI-compatible HTTP server", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="server options (harness serve --help)")
    p.set_defaults(func=cmd_serve)

    return parser


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
        return value
    return parse


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def add_run_options(p: argparse.ArgumentParser) -> None:
    """`harness run`'s options: selection, overrides of the suite (cell parameters, so new cell ids, written
    into the run's resolved suite), run stamps, output, an endpoint without a suite, where cells run."""
    p.add_argument("--only", action="append", default=[], metavar="AXIS=VALUE",
                   help="keep cells whose AXIS equals VALUE (repeatable; same axis ORs, different axes AND)")
    p.add_argument("--dry-run", action="store_true", help="print the cells and server commands, run nothing")
    p.add_argument("--resume", metavar="RUN_ID", help="finish a run that was interrupted (same flags)")
    g = p.add_argument_group("overrides (written into the run's suite; seed, samples and load make new cell ids)")
    g.add_argument("--seed", type=_non_negative_int, help="defaults.seed")
    g.add_argument("--n-samples", "--num-prompts", dest="n_samples", type=_positive(int), metavar="N",
                   help="every task's n_samples (conversations measured per cell)")
    g.add_argument("--max-new-tokens", type=_positive(int), metavar="N", help="every task's max_new_tokens")
    g.add_argument("--concurrency", "--max-concurrency", dest="concurrency", type=_positive(int), action="append",
                   default=[], metavar="N", help="closed-loop load axis (repeatable: --concurrency 1 --concurrency 8)")
    g.add_argument("--rate", "--request-rate", dest="rate", type=_positive(float), action="append", default=[],
                   metavar="RPS", help="open-loop load axis, requests/s (repeatable; replaces the suite's loads)")
    g.add_argument("--repeats", type=_positive(int), help="defaults.repeats (runs of every cell)")
    g = p.add_argument_group("run stamps (stored with the run: v_runs.label, v_runs.metadata)")
    g.add_argument("--label", help="a name for this run")
    g.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE", help="a key/value pair (repeatable)")
    g = p.add_argument_group("output")
    g.add_argument("--quiet", "-q", action="store_true", help="no per-cell lines; only warnings, failures and the "
                                                              "closing block")
    g.add_argument("--no-progress", action="store_true", help="no live progress display (one line per cell)")
    g = p.add_argument_group("an existing OpenAI-compatible endpoint, without a suite file (backend openai)")
    g.add_argument("--endpoint", metavar="URL", help="base URL, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--model", help="the model name the server serves (the request body's model)")
    g.add_argument("--task", action="append", default=[], help="task (repeatable; default gsm8k)")
    g.add_argument("--tokenizer", help="tokenizer path or hub id for token-id prompts (default: --model)")
    g.add_argument("--chat", action="store_true", help="send chat messages; the server applies its template")
    g = p.add_argument_group("execution")
    g.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where cells run: this process, one at a time (default), or a Ray cluster")
    g.add_argument("--address", default=None, help="--executor ray: a running cluster (e.g. auto); default: start one")


def _exit_on_ctrl_c() -> None:
    """A program that is only closing down (its threads and atexit hooks) exits 130 on Ctrl-C at once,
    without the traceback Python would print there."""
    import signal

    def exit_now(signum, frame):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 — a closed pipe: nothing left to flush
                pass
        os._exit(130)

    signal.signal(signal.SIGINT, exit_now)


def _ignore_ctrl_c() -> None:
    """The last atexit hook: past it Python finalises with the default SIGINT action, so a Ctrl-C there
    would kill the process with a signal instead of the exit code it is returning."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None  # `harness …` itself, not a caller (tests) that keeps its own signal handling
    if as_program:
        import atexit

        atexit.register(_ignore_ctrl_c)  # registered first, so it runs last (atexit runs hooks in reverse)
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # a (second) Ctrl-C outside the runner's own handling: one line, no traceback
        print("harness: interrupted (a run is finished with `harness run SUITE --resume RUN_ID`)", file=sys.stderr)
        code = 130
    if as_program:
        _exit_on_ctrl_c()
    return code


def _main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:  # the server parses its own options (argparse would swallow --help)
        from argparse import Namespace

        return cmd_serve(Namespace(rest=argv[1:]))
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `harness query … | head`: the reader left, which is not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
