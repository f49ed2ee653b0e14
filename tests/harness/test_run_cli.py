"""What a new user meets first: the generated suite reference, `harness init`, missing keys at once, the
no-plain warning, command-line overrides (honest cell ids, recorded in the run's suite), --label and
--metadata in v_runs, --quiet, the closing block, the ETA, and `harness run --endpoint` against
`harness serve`."""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path

import pytest
import yaml

from harness.cli import main
from harness.overrides import Overrides, endpoint_suite, load
from harness.progress import Eta, unpaired_warning
from harness.starter import STARTER
from harness.store import Store
from harness.suite import SuiteError, expand, load_suite, parse_suite_text

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------- reference


def test_committed_reference_is_up_to_date(capsys):
    """docs/SUITES.md and docs/suite.schema.json are what `python3 -m harness.suite_reference docs` writes."""
    from harness.suite_reference import main as reference_main

    assert reference_main(["--check", str(REPO / "docs")]) == 0, capsys.readouterr().err


def test_reference_names_every_key_with_its_bounds():
    from harness.suite import schema
    from harness.suite_reference import markdown, sections

    text = markdown()
    for model in sections():
        assert f"## {model.__name__}" in text
        for name in model.model_fields:
            assert f"| `{name}` |" in text, (model.__name__, name)
    assert "≥ 1; ≤ 32" in text  # γ bounds read from the annotation
    assert "one of `markov`, `gated`, `rnn`" in text  # choices read from the _choice validator
    assert all(m in text for m in schema.METHODS)


def test_json_schema_accepts_the_shipped_suites_and_rejects_what_the_loader_rejects():
    jsonschema = pytest.importorskip("jsonschema")
    from harness.suite_reference import EXAMPLES, json_schema

    validator = jsonschema.Draft202012Validator(json_schema())
    jsonschema.Draft202012Validator.check_schema(json_schema())
    docs = [yaml.safe_load(STARTER)] + [yaml.safe_load(load_suite(REPO / "suites" / f).resolved_text)
                                        for f in ("cpu.yaml", "ci.yaml", "h100.yaml")]
    example = yaml.safe_load(STARTER)
    example.update({k: yaml.safe_load(v) for k, v in EXAMPLES.items()})
    docs.append(example)
    for doc in docs:
        assert not list(validator.iter_errors(doc))
    parse_suite_text(yaml.safe_dump(example), "<examples>")  # the reference's examples load, too
    bad = yaml.safe_load(STARTER)
    bad["tasks"]["gsm8k"]["n_samples"] = "8"
    bad["drafters"]["dspark"]["methd"] = "dspark"
    bad["matrix"]["num_drafts"] = [33]
    assert len(list(validator.iter_errors(bad))) == 3


# ------------------------------------------------------------------------------------------- init


def test_init_writes_a_starter_that_runs_as_is(tmp_path, data_env, capsys):
    path = tmp_path / "suite.yaml"
    assert main(["init", str(path)]) == 0
    assert main(["init", str(path)]) == 2  # never overwrites without --force
    suite = load_suite(path)
    cells = expand(suite)
    assert any(c.is_plain for c in cells) and unpaired_warning(cells) is None
    db = tmp_path / "h.duckdb"
    capsys.readouterr()
    code = main(["run", str(path), "--db", str(db), "--only", "drafter=dspark", "--only", "concurrency=1",
                 "--n-samples", "2", "--max-new-tokens", "8", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 ok, 0 failed" in out


# ---------------------------------------------------------------------------------- load messages


def test_missing_required_keys_are_reported_together():
    text = "name: first\ntargets:\n  t: {dtype: float32}\ntasks:\n  gsm8k: {temperature: 0}\nmatrix:\n  task: gsm8k\n"
    with pytest.raises(SuiteError) as err:
        parse_suite_text(text, "first.yaml")
    lines = str(err.value).splitlines()
    assert len(lines) == 4
    assert all(re.match(r"^first\.yaml:\d+:\d+: ", line) for line in lines)
    joined = "\n".join(lines)
    for key in ("'version'", "'path'", "'n_samples'", "'max_new_tokens'"):
        assert key in joined


def test_speculative_cells_without_plain_decoding_warn_at_load(tmp_path, capsys):
    text = STARTER.replace("drafter: [none, dspark, ngram]", "drafter: [dspark, ngram]")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--dry-run", "--db", str(tmp_path / "h.duckdb")]) == 0
    err = capsys.readouterr().err
    assert "harness: warning:" in err and "no plain-decoding cell" in err
    assert "inhouse/embedded/gsm8k/c1" in err and "inhouse/embedded/gsm8k/c4" in err
    path.write_text(STARTER)
    assert main(["run", str(path), "--dry-run"]) == 0
    assert "warning" not in capsys.readouterr().err


# -------------------------------------------------------------------------------------- overrides


def test_overrides_make_new_cell_ids_and_are_in_the_resolved_suite(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(STARTER)
    base = load_suite(path)
    suite = load(path, Overrides(seed=3, n_samples=2, concurrency=(2, 8), repeats=2))
    cells = expand(suite)
    assert {c.seed for c in cells} == {3} and {c.task.n_samples for c in cells} == {2}
    assert {c.concurrency for c in cells} == {2, 8} and suite.repeats == 2
    assert not {c.cell_id for c in cells} & {c.cell_id for c in expand(base)}
    stored = yaml.safe_load(suite.resolved_text)
    assert stored["defaults"]["seed"] == 3 and stored["matrix"]["concurrency"] == [2, 8]
    # an open-loop override replaces the load axis, includes included
    cpu = load(REPO / "suites" / "cpu.yaml", Overrides(rate=(0.5,)))
    assert {(c.concurrency, c.rate) for c in expand(cpu)} == {(None, 0.5)}
    # the same flags again give the same suite (a run can be resumed with them)
    assert load(path, Overrides(seed=3, n_samples=2, concurrency=(2, 8), repeats=2)).hash == suite.hash


def test_bad_override_values_are_one_line(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(STARTER)
    with pytest.raises(SystemExit):
        main(["run", str(path), "--concurrency", "0"])
    assert "must be greater than 0" in capsys.readouterr().err
    assert main(["run", str(path), "--metadata", "novalue"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_label_metadata_quiet_and_closing_block(tmp_path, data_env, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(STARTER)
    db = tmp_path / "h.duckdb"
    args = ["run", str(path), "--db", str(db), "--only", "drafter=none", "--only", "concurrency=1",
            "--n-samples", "2", "--max-new-tokens", "6", "--quiet"]
    assert main([*args, "--label", "nightly", "--metadata", "gpu=none", "--metadata", "owner=h5"]) == 0
    out = capsys.readouterr().out
    assert "[1/" not in out and "cell " not in out  # quiet: no per-cell lines, no table
    with Store.open(db, read_only=True) as store:
        _, rows = store.query("SELECT run_id, label, metadata FROM v_runs")
    (run_id, label, metadata), = rows
    assert label == "nightly" and json.loads(metadata) == {"gpu": "none", "owner": "h5"}
    assert f"run id: {run_id}" in out and f"harness report {run_id}" in out and "harness query" in out
    assert main([*args[:-1], "--no-progress"]) == 0  # a second run: the block names the first for compare/gate
    out = capsys.readouterr().out
    assert f"harness compare {run_id} " in out and f"--baseline {run_id}" in out
    assert "TTFT p50 (ms)" in out and "τ (tok/step)" in out  # one table, units in the headers


def test_eta_from_history_then_from_this_runs_speed():
    class C:
        def __init__(self, cell_id):
            self.cell_id = cell_id

    a, b, c = C("a"), C("b"), C("c")
    eta = Eta(history={"a": 10.0, "b": 20.0})
    assert Eta().seconds() is None or Eta().seconds() == 0.0
    eta.planned([(a, 0), (b, 0), (c, 0)])
    assert eta.seconds() == pytest.approx(10 + 20 + 15)  # c: no history, the history's mean
    eta.finished(a, 0, 20.0)  # this run is twice as slow as the history
    assert eta.seconds() == pytest.approx(40 + 20)  # b: 20 × 2; c: the mean of the finished cells (20)
    fresh = Eta()
    fresh.planned([(a, 0), (b, 0)])
    assert fresh.seconds() is None
    fresh.finished(a, 0, 3.0)
    assert fresh.seconds() == pytest.approx(3.0)


# --------------------------------------------------------------------------------------- endpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_endpoint_suite_is_valid_and_plain():
    suite = parse_suite_text(endpoint_suite("http://127.0.0.1:9/v1", "Qwen/Qwen3-8B", ["gsm8k", "mt_bench"]))
    cells = expand(suite)
    assert {c.backend for c in cells} == {"openai"} and all(c.is_plain for c in cells)
    assert suite.backend_options["openai"]["base_url"] == "http://127.0.0.1:9/v1"


def test_run_against_an_existing_endpoint_without_yaml(tmp_path, data_env, capsys):
    """`harness run --endpoint URL --model NAME` measures a running `harness serve` through the openai backend."""
    from backends.process import ServerProcess

    port = _free_port()
    argv = [sys.executable, "-m", "harness", "serve", "--port", str(port), "--num-slots", "2", "--num-threads", "1",
            "--device", "cpu", "--served-model-name", "embedded"]
    server = ServerProcess(argv, f"http://127.0.0.1:{port}/health", cwd=REPO, startup_timeout_s=180).start()
    try:
        db = tmp_path / "h.duckdb"
        code = main(["run", "--endpoint", f"http://127.0.0.1:{port}/v1", "--model", "embedded", "--task", "gsm8k",
                     "--n-samples", "2", "--max-new-tokens", "8", "--db", str(db), "--no-progress"])
        out = capsys.readouterr().out
        assert code == 0, out
    finally:
        server.close()
    with Store.open(db, read_only=True) as store:
        _, rows = store.query("SELECT c.backend, c.status, r.suite_name, r.suite_text FROM v_cells c "
                              "JOIN runs r USING (run_id)")
    (backend, status, suite_name, suite_text), = rows
    assert (backend, status, suite_name) == ("openai", "ok", "endpoint-embedded")
    assert f"127.0.0.1:{port}" in suite_text  # the run stores the suite it ran


def test_query_prints_markdown(tmp_path, capsys):
    db = tmp_path / "h.duckdb"
    with Store.open(db):
        pass
    assert main(["query", "--db", str(db), "--format", "markdown", "select 1.5 as n, 'a|b' as s"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["| n | s |", "|---:|---|", "| 1.5 | a\\|b |"]
