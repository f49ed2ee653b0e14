"""Malformed suites as `harness run SUITE --dry-run` meets them: each class of bad input is refused at
load with exit 2 and one line (file:line:col, the field, what is valid), short whatever the input's
size; the suites a real user needs (a raised ceiling, a good include) still load."""

from __future__ import annotations

import re

import pytest

from fuzz_table import SUITE, Row, check, run_cli


def edit(old: str, new: str) -> str:
    assert old in SUITE, old
    return SUITE.replace(old, new, 1)


def add(text: str) -> str:
    return SUITE + text


TASK = "  gsm8k: {n_samples: 4, max_new_tokens: 8, temperature: 0}"
BIG = "x" * 1_000_000

ROWS = [
    # bytes and structure
    Row("not UTF-8", SUITE.encode().replace(b"name: fuzz", b"name: fu\xffzz"), 2, re.compile(r"s\.yaml:2:9: not UTF-8")),
    Row("latin-1 text", SUITE.encode().replace(b"fuzz", "füzz".encode("latin-1")), 2, "not UTF-8"),
    Row("a NUL byte", SUITE.replace("name: fuzz", "name: fu\x00zz"), 2, "invalid YAML: character #x0000"),
    Row("binary file", bytes(range(256)) * 40, 2, "not UTF-8"),
    Row("nested brackets (1.2 KB)", "version: 1\nname: x\nmatrix: " + "[" * 600 + "]" * 600 + "\n", 2, "nested too deeply"),
    Row("nested brackets (100 KB)", "version: 1\nname: x\nmatrix: " + "[" * 50_000 + "\n", 2, "nested too deeply"),
    Row("nested mappings", "version: 1\nname: x\nmatrix:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(40)),
        2, "nested too deeply"),
    Row("5,000-digit integer", edit("seed: 0", "seed: " + "9" * 5000) if "seed: 0" in SUITE else
        edit("warmup: 0", "warmup: " + "9" * 5000), 2, "does not fit a 64-bit integer"),
    Row("seed above INT64", edit("warmup: 0,", "seed: 9223372036854775808, warmup: 0,"), 2,
        "does not fit a 64-bit integer"),
    Row("seed at INT64", edit("warmup: 0,", "seed: 9223372036854775807, warmup: 0,"), 0, "suite fuzz ("),
    Row("negative seed", edit("warmup: 0,", "seed: -1, warmup: 0,"), 2, "defaults.seed: must be at least 0"),
    Row("empty file", "", 2, "empty suite file"),
    Row("a list, not a mapping", "- a\n- b\n", 2, "a suite file is a mapping"),
    Row("a python tag", add("description: !!python/object:os.system ls\n"), 2, "tag !!python/object:os.system is not allowed"),
    Row("a 1 MB value", edit("drafter: [none, dspark]", f"drafter: [none, {BIG}]"), 2,
        re.compile(r"matrix\.drafter\[1\]: drafter 'x{60}'… \(1000000 characters\) is not defined")),
    Row("a 1 MB quoted name", edit("name: fuzz", f"name: 'a b{BIG}'"), 2, "(1000003 characters)"),
    Row("a 1 MB key", add(f"{BIG}: 1\n"), 2, "invalid YAML: could not find expected ':'"),
    Row("a 1000-character key", add(f"{'k' * 1000}: 1\n"), 2, re.compile(r"unknown key 'k{60}'… \(1000 characters\)")),
    Row("a 1 MB description", edit("name: fuzz", f"name: fuzz\ndescription: {BIG}"), 0, "suite fuzz ("),
    # sizes that would exhaust a machine
    Row("max_new_tokens 1e9", edit("max_new_tokens: 8", "max_new_tokens: 1000000000"), 2,
        "tasks.gsm8k.max_new_tokens: 1000000000 is above the ceiling of 32768"),
    Row("max_new_tokens 1e9 as a float", edit("max_new_tokens: 8", "max_new_tokens: 1.0e+9"), 2, "expected an integer"),
    Row("n_samples 1e9", edit("n_samples: 4", "n_samples: 1000000000"), 2, "above the ceiling of 100000 for n_samples"),
    Row("concurrency 1e9", edit("concurrency: [1]", "concurrency: [1, 1000000000]"), 2,
        "matrix.concurrency[1]: 1000000000 is above the ceiling of 4096"),
    Row("default concurrency 1e9", edit("warmup: 0,", "concurrency: 1000000000, warmup: 0,").replace(
        "  concurrency: [1]\n", ""), 2, "defaults.concurrency: 1000000000 is above the ceiling"),
    Row("repeats 1e9", edit("repeats: 1", "repeats: 1000000000"), 2, "above the ceiling of 1000 for repeats"),
    Row("bootstrap resamples 1e12", edit("min_samples: 4}", "min_samples: 4, resamples: 1000000000000}"), 2,
        "above the ceiling of 1000000 for resamples"),
    Row("a matrix of 10^8 cells", edit("num_drafts: [3]", "num_drafts: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]").replace(
        "concurrency: [1]", "concurrency: [" + ", ".join(str(c) for c in range(1, 2001)) + "]"), 2,
        "combinations, above the ceiling of 10000 for cells"),
    Row("a raised ceiling loads", edit("max_new_tokens: 8", "max_new_tokens: 40000") + "limits: {max_new_tokens: 40000}\n",
        0, "suite fuzz ("),
    Row("a ceiling beyond the store's columns", add("limits: {concurrency: 4294967296}\n"), 2,
        "limits.concurrency: must be at most 2147483647"),
    Row("an unknown limit", add("limits: {max_tokens: 5}\n"), 2, "did you mean 'max_new_tokens'?"),
    # floats that are not numbers
    Row("temperature .inf", edit(TASK, TASK.replace("temperature: 0", "temperature: .inf")), 2,
        "tasks.gsm8k.temperature: must be a finite number, got inf"),
    Row("temperature .nan", edit(TASK, TASK.replace("temperature: 0", "temperature: .nan")), 2, "must be a finite number"),
    Row("rate .inf", edit("concurrency: [1]", "rate: [.inf]"), 2, "matrix.rate[0]: must be a finite number, got inf"),
    Row("rate -.inf", edit("concurrency: [1]", "rate: [-.inf]"), 2, "must be a finite number"),
    Row("sla .nan", add("sla: {ttft_s: .nan}\n"), 2, "must be a finite number"),
    Row("gate alpha .nan", edit("min_samples: 4}", "min_samples: 4, alpha: .nan}"), 2, "must be a finite number"),
    Row("validity .inf", edit("min_duration_s: 0.0", "min_duration_s: .inf"), 2, "must be a finite number"),
    # gates on metrics the harness records
    Row("gate on an unknown metric", add("  made_up_metric: {direction: higher}\n"), 2,
        "gates.made_up_metric: unknown metric 'made_up_metric'"),
    Row("gate on a typo", add("  acceptance_lenght: {direction: higher}\n"), 2, "did you mean 'acceptance_length'?"),
    Row("gate on a position past γ", add("  position_acceptance_conditional_k99: {direction: higher}\n"), 2,
        "unknown metric"),
    Row("gate on a position", add("  position_acceptance_conditional_k2: {direction: higher, test: threshold}\n"), 0, "suite fuzz ("),
    Row("gate on a latency percentile", add("  ttft_p99: {direction: lower, test: threshold}\n"), 0, "suite fuzz ("),
    Row("gate that cannot fire in the suite's rounds", add("  ttft_p99: {direction: lower}\n"), 2,
        "gate ttft_p99 (paired_bootstrap, alpha 0.05, min_samples 8) needs repeats >= 8 (rounds), the suite has 1"),
    # backend options, per backend
    Row("unknown in-house option", add("backend_options: {inhouse: {num_slot: 4}}\n"), 2,
        "backend_options.inhouse.num_slot: unknown inhouse backend option 'num_slot' (did you mean 'num_slots'?)"),
    Row("negative in-house option", add("backend_options: {inhouse: {num_slots: -1}}\n"), 2,
        "backend_options.inhouse.num_slots: must be at least 1, got -1"),
    Row("huge in-house context", add("backend_options: {inhouse: {max_context: 100000000000}}\n"), 2, "must be at most"),
    Row("in-house option of the wrong type", add("backend_options: {inhouse: {num_threads: '2'}}\n"), 2,
        "expected an integer, got '2'"),
    Row("unknown openai option", add("backend_options: {openai: {base_ur: 'http://x'}}\n"), 2,
        "unknown openai backend option 'base_ur' (did you mean 'base_url'?)"),
    Row("negative openai timeout", add("backend_options: {openai: {timeout_s: -5}}\n"), 2,
        "backend_options.openai.timeout_s: must be at least"),
    Row("vllm port out of range", add("backend_options: {vllm: {port: 70000}}\n"), 2,
        "backend_options.vllm.port: must be at most 65535"),
    Row("vllm draft layout", add("backend_options: {vllm: {draft_layout: eagle}}\n"), 2, "unknown value 'eagle'"),
    Row("vllm env entry", add("backend_options: {vllm: {env: [NOEQUALS]}}\n"), 2, "env entries are NAME=value strings"),
    Row("vllm server flag .inf", add("backend_options: {vllm: {gpu_memory_utilization: .inf}}\n"), 2,
        "must be a finite number"),
    Row("sglang startup timeout 0", add("backend_options: {sglang: {startup_timeout_s: 0}}\n"), 2, "must be at least"),
    Row("vllm server flags pass", add("backend_options: {vllm: {gpu_memory_utilization: 0.9, enforce_eager: true}}\n"),
        0, "suite fuzz ("),
    # includes must be YAML suites
    Row("include /etc/passwd", add("include: /etc/passwd\n"), 2,
        "include: included file /etc/passwd is not a YAML suite file (.yaml or .yml)"),
    Row("include a text file", add("include: notes.txt\n"), 2, "notes.txt is not a YAML suite file"),
    Row("include a binary .yaml", add("include: binary.yaml\n"), 2, re.compile(r"binary\.yaml:1:\d+: not UTF-8")),
    Row("include a list", add("include: [list.yaml]\n"), 2, "list.yaml:1:1: a suite file is a mapping"),
    Row("include a huge .yaml", add("include: huge.yaml\n"), 2, "larger than a suite can be"),
    Row("include a fragment without version", add("include: noversion.yaml\n"), 2, "missing required key 'version'"),
    Row("include a directory", add("include: adir.yaml\n"), 2, "not found"),
    Row("include a good fragment", add("include: fragment.yaml\n"), 0, "suite fuzz ("),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suites")
    (tmp / "notes.txt").write_text("version: 1\n")
    (tmp / "binary.yaml").write_bytes(b"\x00\xff\xfe" * 100)
    (tmp / "list.yaml").write_text("- 1\n- 2\n")
    (tmp / "huge.yaml").write_text("version: 1\n" + "#" * 5_000_000 + "\n")
    (tmp / "noversion.yaml").write_text("name: frag\n")
    (tmp / "adir.yaml").mkdir()
    (tmp / "fragment.yaml").write_text("version: 1\ndescription: shared parts\n")
    return tmp


@pytest.mark.parametrize("row", ROWS, ids=Row.name_of)
def test_suite_table(row, folder, capsys):
    path = folder / "s.yaml"
    path.write_bytes(row.given if isinstance(row.given, bytes) else row.given.encode("utf-8"))
    code, out, err = run_cli(["run", path, "--dry-run"], capsys)
    check(row, code, out, err)
