"""`harness run` end to end on the embedded default: cells recorded, failures recorded, bad input
refused before anything is written, a killed run resumed, and the gate catching a doctored regression
while an identical rerun passes."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.progress import PlainDisplay
from harness.runner import load_cells, plan, round_slots, run_suite
from harness.store import Store, read_only_query

REPO = Path(__file__).resolve().parents[2]

SUITE = """\
version: 1
name: tiny
targets:
  embedded: {path: embedded}
drafters:
  none: {method: none}
  dspark: {method: dspark, checkpoint: "embedded:dspark"}
  %(extra_drafter)s
tasks:
  gsm8k: {n_samples: %(n)d, max_new_tokens: 12, temperature: 0}
defaults: {backend: inhouse, warmup: 0, repeats: 1}
backend_options:
  inhouse: {num_threads: 1}
matrix:
  target: [embedded]
  drafter: [%(drafters)s]
  num_drafts: [3]
  task: [gsm8k]
  concurrency: [%(concurrency)s]
validity: {min_requests: 2, min_duration_s: 0.0, max_failed_fraction: 0.5}
gates:
  acceptance_length: {direction: higher, test: paired_bootstrap, relative: 0.02, min_samples: 4, level: fail}
"""


def write_suite(tmp_path: Path, name="tiny.yaml", n=6, drafters="none, dspark", concurrency="1", extra_drafter="") -> Path:
    path = tmp_path / name
    path.write_text(SUITE % {"n": n, "drafters": drafters, "concurrency": concurrency, "extra_drafter": extra_drafter})
    return path




def test_run_records_every_cell_and_query_reads_them(tmp_path, data_env, capsys):
    db = tmp_path / "h.duckdb"
    assert main(["run", str(write_suite(tmp_path, concurrency="1, 2")), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "6 ok, 0 failed" in out  # 2 speculative cells, each between 2 passes of its plain cell
    columns, rows = read_only_query(db, "select drafter, concurrency, acceptance_length from v_acceptance "
                                        "join cells using (run_id, cell_id, repeat) where repeat = 0 "
                                        "order by drafter, concurrency")
    assert [r[:2] for r in rows] == [("dspark", 1), ("dspark", 2), ("none", 1), ("none", 2)]
    assert rows[0][2] > 1.5 and rows[2][2] is None  # DSpark accepts drafts; plain decoding has no drafting step
    # greedy: speculative output equals plain decoding, request by request, in the store
    _, outs = read_only_query(db, "select c.drafter, r.prompt_key, r.output_ids from requests r join cells c "
                                  "using (run_id, cell_id, repeat) where c.concurrency = 1")
    by_drafter: dict[str, dict] = {}
    for drafter, key, ids in outs:
        by_drafter.setdefault(drafter, {})[key] = ids
    assert by_drafter["dspark"] == by_drafter["none"]
    assert main(["query", "--db", str(db), "--format", "json", "select count(*) as n from v_speedup"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 2}]
    # every round validated (none flagged on a sound run), and the paired summary printed per cell
    assert read_only_query(db, "select count(*) from v_rounds where problems is not null")[1] == [(0,)]
    assert "speedup over plain decoding, paired per round" in out
    _, summary = read_only_query(db, "select status, rounds from v_speedup_summary order by label")
    # valid, never invalid; unstable where the machine (shared, no warm-up here) moved > 10% inside the round
    assert len(summary) == 2 and all(status in ("ok", "unstable") and rounds == 1 for status, rounds in summary)


def truncated_embedded_target(directory: Path, num_layers: int = 2) -> Path:
    """The embedded target cut to its first `num_layers` decoder layers, saved with its tokenizer: a smaller
    Hugging Face LM with the target's vocabulary, i.e. a valid `draft_model` draft that is not the target."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inputs import model_refs

    location = model_refs.resolve("embedded").location
    target = AutoModelForCausalLM.from_pretrained(location, dtype="float32")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    config.layer_types = config.layer_types[:num_layers]
    draft = type(target)(config).eval()
    missing, _ = draft.load_state_dict(target.state_dict(), strict=False)
    assert not missing, missing
    draft.save_pretrained(directory)
    AutoTokenizer.from_pretrained(location).save_pretrained(directory)
    return directory


def test_draft_model_cells_are_lossless_and_record_their_draft(tmp_path, data_env):
    """draft_model on the in-house engine: the embedded target as its own draft (`embedded`: every greedy
    draft accepted) and a 2-layer cut of it saved as a local directory; both give plain decoding's outputs.
    A causal LM with another vocabulary fails its cell with the reason, and the suite goes on."""
    from conftest import tiny_qwen3

    db = tmp_path / "h.duckdb"
    small = truncated_embedded_target(tmp_path / "small")

    tiny_qwen3(vocab_size=96).save_pretrained(tmp_path / "other_vocab")
    extra = (f'self: {{method: draft_model, checkpoint: embedded}}\n  small: {{method: draft_model, checkpoint: "{small}"}}'
             f'\n  other: {{method: draft_model, checkpoint: "{tmp_path / "other_vocab"}"}}')
    suite = write_suite(tmp_path, n=4, drafters="none, self, small, other", extra_drafter=extra)
    assert main(["run", str(suite), "--db", str(db)]) == 1
    _, status = read_only_query(db, "select drafter, status, error from cells")
    status = {d: (s, e) for d, s, e in status}
    assert {d: s for d, (s, _) in status.items()} == {"none": "ok", "self": "ok", "small": "ok", "other": "failed"}
    assert "vocabulary has 96 tokens, the target's 4096" in status["other"][1]
    _, outs = read_only_query(db, "select c.drafter, r.prompt_key, r.output_ids from requests r join cells c "
                                  "using (run_id, cell_id, repeat)")
    by_drafter: dict[str, dict] = {}
    for drafter, key, ids in outs:
        by_drafter.setdefault(drafter, {})[key] = ids
    assert by_drafter["self"] == by_drafter["none"] and by_drafter["small"] == by_drafter["none"]
    _, counts = read_only_query(db, "select c.drafter, sum(s.num_verified), sum(s.num_accepted) from request_steps s "
                                    "join cells c using (run_id, cell_id, repeat) group by c.drafter order by 1")
    counts = {d: (int(v), int(a)) for d, v, a in counts}
    assert counts["self"][0] > 0 and counts["self"][0] == counts["self"][1]
    assert 0 < counts["small"][1] < counts["small"][0]
    _, hashes = read_only_query(db, "select drafter, json_extract_string(provenance, '$.draft_hash') from cells "
                                    "where status = 'ok'")
    hashes = dict(hashes)
    assert hashes["none"] == "" and hashes["self"] and hashes["small"] and hashes["self"] != hashes["small"]


def test_failing_cell_is_recorded_and_the_suite_goes_on(tmp_path, data_env, capsys):
    db = tmp_path / "h.duckdb"
    # a dflash drafter pointed at a dspark checkpoint: passes the file check, fails when it loads
    suite = write_suite(tmp_path, drafters="none, wrong", extra_drafter='wrong: {method: dflash, checkpoint: "embedded:dspark"}')
    assert main(["run", str(suite), "--db", str(db)]) == 1
    out = capsys.readouterr().out
    assert "2 ok, 1 failed" in out and "holds a 'dspark' draft, not 'dflash'" in out
    _, rows = read_only_query(db, "select drafter, status, error from cells order by drafter, repeat")
    assert [(r[0], r[1]) for r in rows] == [("none", "ok"), ("none", "ok"), ("wrong", "failed")]


@pytest.mark.parametrize("mutation, message", [
    ("matrix:\n  drafter: [none, dsprak]", "drafter 'dsprak' is not defined (did you mean 'dspark'?)"),
    ("tasks:\n  gsm8k: {n_samples: four, max_new_tokens: 12}", "n_samples"),
    ("drafters:\n  dspark: {method: dspark, checkpoint: \"embedded:nope\"}", "nope"),
    ("version: 1\nname: [unclosed", "tiny.yaml:"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, data_env, capsys, mutation, message):
    suite = write_suite(tmp_path)
    text = suite.read_text()
    key = mutation.split(":", 1)[0]
    if key == "version":
        text = mutation
    else:
        import yaml

        doc = yaml.safe_load(text)
        doc.update(yaml.safe_load(mutation) if key != "matrix" else {"matrix": {**doc["matrix"], **yaml.safe_load(mutation)["matrix"]}})
        text = yaml.safe_dump(doc)
    suite.write_text(text)
    db = tmp_path / "h.duckdb"
    assert main(["run", str(suite), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not db.exists()


def test_dry_run_prints_cells_and_exact_server_commands(capsys):
    assert main(["run", str(REPO / "suites" / "h100.yaml"), "--dry-run", "--only", "backend=vllm",
                 "--only", "concurrency=8"]) == 0
    out = capsys.readouterr().out
    assert "vllm.entrypoints.openai.api_server" in out and "--speculative-config" in out
    assert '"method":"dspark"' in out


def test_killed_run_resumes_without_rerunning_finished_cells(tmp_path, data_env):
    db = tmp_path / "h.duckdb"
    suite = write_suite(tmp_path, n=4, concurrency="1, 2, 3")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(suite), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[2/"):
            proc.send_signal(signal.SIGKILL)  # no chance to clean up: the store must still hold cells 1-2
            break
    proc.wait(timeout=60)
    run_id = lines[0].split()[1].rstrip(":")
    with Store.open(db) as store:
        assert len(store.cell_status(run_id)) == 2
        assert store.run(run_id)["status"] == "running"
    assert main(["run", str(suite), "--db", str(db), "--resume", run_id]) == 0
    with Store.open(db, read_only=True) as store:
        status = store.cell_status(run_id)
        assert len(status) == 9 and set(status.values()) == {"ok"}  # 3 × (plain, DSpark, closing plain pass)
        assert store.run(run_id)["status"] == "finished"
        # the resumed run went on from the cell it stopped at, in the planned interleaved order
        _, order = store.query("SELECT cell_id, repeat, round_slot FROM cells WHERE run_id = ? ORDER BY started_at", [run_id])
    loaded, cells = load_cells(suite, check_files=False)
    work = plan(cells, loaded.repeats)
    slots = round_slots(work, loaded.repeats)
    assert order == [(c.cell_id, r, slots[(c.cell_id, r)]) for c, r in work]


def test_gate_passes_an_identical_rerun_and_catches_a_doctored_regression(tmp_path, data_env, capsys):
    db = tmp_path / "h.duckdb"
    suite = write_suite(tmp_path, n=8, drafters="dspark")
    assert main(["run", str(suite), "--db", str(db)]) == 0
    assert main(["gate", "--db", str(db)]) == 3  # nothing to compare with yet
    assert main(["run", str(suite), "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["gate", "--db", str(db)]) == 0
    assert "PASS" in capsys.readouterr().out
    # doctor the latest run: every step accepted one draft fewer where it accepted any
    with Store.open(db) as store:
        latest = store.latest_run()
        store.con.execute("update request_steps set num_accepted = greatest(num_accepted - 1, 0) where run_id = ?", [latest])
    junit = tmp_path / "gate.xml"
    assert main(["gate", "--db", str(db), "--format", "junit", "--output", str(junit)]) == 1
    import xml.etree.ElementTree as ET

    root = ET.parse(junit).getroot()
    assert int(root.get("failures") or root.find("testsuite").get("failures")) >= 1
    assert main(["gate", "--db", str(db), "--format", "markdown"]) == 1
    out = capsys.readouterr().out
    assert "acceptance_length" in out and "REGRESSION" in out.upper()
    # the baseline kept as a file in the repo works the same way
    base = tmp_path / "baseline.json"
    previous = None
    with Store.open(db, read_only=True) as store:
        previous = store.latest_run(before=latest)
    assert main(["baseline", "export", str(base), "--db", str(db), "--run", previous]) == 0
    assert main(["gate", "--db", str(db), "--baseline", str(base)]) == 1


def test_query_is_read_only(tmp_path, data_env, capsys):
    db = tmp_path / "h.duckdb"
    assert main(["run", str(write_suite(tmp_path, n=2, drafters="none")), "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["query", "--db", str(db), "delete from cells"]) == 2
    assert "read-only" in capsys.readouterr().err
    _, rows = read_only_query(db, "select count(*) from cells")
    assert rows == [(1,)]


def readme_queries() -> list[str]:
    """The `harness query "…"` examples of the README, as written there."""
    import re

    text = (REPO / "README.md").read_text()
    return [" ".join(q.split()) for q in re.findall(r'harness query "(.*?)"', text, flags=re.S)]


def test_readme_sql_examples_run_on_a_real_store(tmp_path, data_env, capsys):
    queries = readme_queries()
    assert len(queries) >= 3
    db = tmp_path / "h.duckdb"
    suite = write_suite(tmp_path, n=4, drafters="none, dspark")
    text = suite.read_text().replace("num_drafts: [3]", "num_drafts: [7]").replace("task: [gsm8k]", "task: [gsm8k, mt_bench]")
    text = text.replace("tasks:\n", "tasks:\n  mt_bench: {n_samples: 2, max_new_tokens: 8}\n")
    suite.write_text(text)
    assert main(["run", str(suite), "--db", str(db)]) == 0
    for sql in queries:
        capsys.readouterr()
        assert main(["query", "--db", str(db), "--format", "json", sql]) == 0, sql
        assert json.loads(capsys.readouterr().out), f"no rows: {sql}"


def test_missing_data_exits_2_before_writing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    db = tmp_path / "h.duckdb"
    assert main(["run", str(write_suite(tmp_path)), "--db", str(db)]) == 2
    assert "missing gsm8k/test.jsonl" in capsys.readouterr().err
    assert not db.exists()


def test_locked_and_newer_schema_stores_exit_2(tmp_path, data_env, capsys):
    db = tmp_path / "h.duckdb"
    with Store.open(db):
        pass
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('ready', flush=True); time.sleep(60)", str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert main(["run", str(write_suite(tmp_path)), "--db", str(db)]) == 2
        assert "lock" in capsys.readouterr().err.lower()
    finally:
        holder.kill()
        holder.wait()
    import duckdb

    con = duckdb.connect(str(db))
    con.execute("insert into schema_migrations values (999, 'from the future', now())")
    con.close()
    assert main(["run", str(write_suite(tmp_path)), "--db", str(db)]) == 2
    assert "newer" in capsys.readouterr().err
    assert main(["query", "--db", str(db), "select 1"]) == 2


def test_gate_on_an_interrupted_run_is_invalid(tmp_path, data_env, capsys):
    db = tmp_path / "h.duckdb"
    suite = write_suite(tmp_path, n=6, drafters="dspark")
    assert main(["run", str(suite), "--db", str(db)]) == 0
    assert main(["run", str(suite), "--db", str(db)]) == 0
    with Store.open(db) as store:
        store.set_run_status(store.latest_run(), "interrupted")
    capsys.readouterr()
    assert main(["gate", "--db", str(db)]) == 2
    assert "INVALID" in capsys.readouterr().out


def test_ingest_pytest_benchmark_json(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({
        "machine_info": {"node": "x", "cpu": {"brand_raw": "cpu"}}, "commit_info": {"id": "abc"},
        "datetime": "2026-11-29T10:00:00", "version": "5.2.3",
        "benchmarks": [{"group": None, "name": "test_scheduler[256x7]", "fullname": "tests/b.py::test_scheduler[256x7]",
                        "params": {"shape": "256x7"}, "stats": {"min": 1e-4, "max": 3e-4, "mean": 1.5e-4, "stddev": 1e-5,
                        "rounds": 100, "median": 1.4e-4, "iterations": 1, "ops": 6666.0}, "options": {}, "extra_info": {}}],
    }))
    db = tmp_path / "h.duckdb"
    assert main(["ingest", str(bench), "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["query", "--db", str(db), "--format", "csv", "select name, median from benchmarks"]) == 0
    assert "test_scheduler[256x7],0.00014" in capsys.readouterr().out


def test_ctrl_c_marks_the_run_interrupted_and_keeps_finished_cells(tmp_path, data_env):
    db = tmp_path / "h.duckdb"
    suite = write_suite(tmp_path, n=4, concurrency="1, 2, 3")
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", str(suite), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[1/"):
            proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    run_id = lines[0].split()[1].rstrip(":")
    assert any(f"--resume {run_id}" in line for line in lines)
    with Store.open(db, read_only=True) as store:
        assert store.run(run_id)["status"] == "interrupted"
        assert 1 <= len(store.cell_status(run_id)) < 9


class SwallowingBackend:
    """A backend whose cell catches every Exception, as an engine adapter must (the cell then fails and
    the suite goes on), and that receives SIGTERM while inside that `try`."""

    def __init__(self, **options):
        pass

    def run_cell(self, cell, progress=None):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"the cell failed: {exc}") from exc
        raise AssertionError("the signal never arrived")

    def close(self):
        pass


def test_sigterm_inside_a_backends_broad_except_stops_the_run(tmp_path, data_env, monkeypatch):
    from contracts import backend as registry

    monkeypatch.setitem(registry.BACKENDS, "inhouse", f"{__name__}:SwallowingBackend")
    db = tmp_path / "h.duckdb"
    outcome = run_suite(write_suite(tmp_path, n=4, drafters="none"), db_path=db, display=PlainDisplay(io.StringIO()))
    assert outcome.interrupted and outcome.outcomes == []  # not a failed cell, and nothing after it ran
    with Store.open(db, read_only=True) as store:
        assert store.run(outcome.run_id)["status"] == "interrupted"
