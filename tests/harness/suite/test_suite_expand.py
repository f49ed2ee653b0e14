"""Expansion: product, exclude, normalisation of plain decoding, include, dedup, stable ids; --only."""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import pytest
from suite_fixtures import BASE, at, error_of

from contracts.cells import Cell
from harness.suite import SuiteError, expand, parse_suite_text, select

MATRIX = BASE.split("matrix:\n")[0] + "matrix:\n"


def cells_of(matrix: str, head: str = MATRIX) -> list[Cell]:
    return expand(parse_suite_text(head + matrix))


def keys(cells: list[Cell], *axes: str) -> list[tuple]:
    return [tuple(c.axes()[a] for a in axes) for c in cells]


def test_product_size_and_order():
    cells = expand(parse_suite_text(BASE))
    assert len(cells) == 2 + 2 * 2  # plain × c{1,4}; dspark × γ{3,7} × c{1,4}
    assert keys(cells, "drafter", "num_drafts", "concurrency") == [
        ("none", 0, 1), ("none", 0, 4), ("dspark", 3, 1), ("dspark", 3, 4), ("dspark", 7, 1), ("dspark", 7, 4)]
    assert len({c.cell_id for c in cells}) == len(cells)


def test_full_product_count():
    cells = cells_of("""\
  backend: [inhouse, vllm]
  drafter: [dspark, dflash]
  num_drafts: [1, 3, 7]
  task: [gsm8k, mt_bench]
  temperature: [0, 1]
  concurrency: [1, 4]
  rate: [2.0]
""")
    assert len(cells) == 2 * 2 * 3 * 2 * 2 * 3
    assert {(c.concurrency, c.rate) for c in cells} == {(1, None), (4, None), (None, 2.0)}


def test_plain_decoding_collapses_gamma_and_policy():
    cells = cells_of("""\
  backend: [inhouse]
  drafter: [none, dspark]
  num_drafts: [1, 3, 7]
  policy: [full, scheduler, thr07]
  task: [gsm8k]
  concurrency: [1]
""")
    plain = [c for c in cells if c.is_plain]
    assert len(plain) == 1 and plain[0].num_drafts == 0 and plain[0].policy.name == "full"
    assert len(cells) == 1 + 3 * 3
    assert cells[0].is_plain  # first written, first expanded


def test_task_temperature_and_the_temperature_axis():
    cells = cells_of("  backend: [inhouse]\n  drafter: [none]\n  task: [gsm8k, mt_bench]\n  concurrency: [1]\n")
    assert keys(cells, "task", "temperature") == [("gsm8k", 0.0), ("mt_bench", 0.5)]
    cells = cells_of("  backend: [inhouse]\n  drafter: [none]\n  task: [gsm8k, mt_bench]\n  temperature: [0, 1]\n"
                     "  concurrency: [1]\n")
    assert keys(cells, "task", "temperature") == [("gsm8k", 0.0), ("gsm8k", 1.0), ("mt_bench", 0.0), ("mt_bench", 1.0)]
    assert all(isinstance(c.task.temperature, float) for c in cells)


def test_exclude_partial_rules_lists_and_method():
    base = "  backend: [inhouse]\n  drafter: [none, dspark, dflash]\n  num_drafts: [1, 3, 7]\n  task: [gsm8k]\n" \
           "  concurrency: [1, 4, 16]\n"
    assert len(cells_of(base)) == 3 + 2 * 3 * 3
    cells = cells_of(base + "  exclude:\n    - {num_drafts: [1, 3], concurrency: 16}\n    - {method: dflash, num_drafts: 1}\n")
    assert len(cells) == 3 + (3 * 3 - 2) + (3 * 3 - 2 - 2)
    assert not any(c.concurrency == 16 and c.num_drafts in (1, 3) for c in cells)
    assert [c for c in cells if c.is_plain and c.concurrency == 16]  # plain comes from γ 7 too


def test_exclude_matches_before_plain_collapse():
    cells = cells_of("  backend: [inhouse]\n  drafter: [none, dspark]\n  num_drafts: [3]\n  policy: [full, scheduler]\n"
                     "  task: [gsm8k]\n  concurrency: [1]\n  exclude: [{policy: full}]\n")
    assert keys(cells, "drafter", "policy") == [("none", "full"), ("dspark", "scheduler")]
    cells = cells_of("  backend: [inhouse]\n  drafter: [none, dspark]\n  num_drafts: [3]\n  task: [gsm8k]\n"
                     "  concurrency: [1]\n  exclude: [{drafter: none}]\n")
    assert keys(cells, "drafter") == [("dspark",)]


def test_exclude_temperature_uses_the_task_temperature():
    cells = cells_of("  backend: [inhouse]\n  drafter: [none]\n  task: [gsm8k, mt_bench]\n  concurrency: [1]\n"
                     "  exclude: [{temperature: 0.5}]\n")
    assert keys(cells, "task") == [("gsm8k",)]


def test_include_entries_are_filled_and_appended():
    head = MATRIX.replace("matrix:\n", "defaults: {policy: thr07, concurrency: 8}\nmatrix:\n")
    cells = cells_of("""\
  backend: [inhouse]
  drafter: [none, dspark]
  num_drafts: [3, 7]
  policy: [full]
  task: [mt_bench, gsm8k]
  concurrency: [1]
  exclude: [{drafter: dspark, num_drafts: 7}]
  include:
    - {drafter: dspark, num_drafts: 7, policy: static3}
    - {drafter: dspark}
    - {drafter: dspark, num_drafts: 3, task: mt_bench, policy: full, concurrency: 1}
    - {drafter: dflash, rate: 2.5, task: gsm8k, policy: full}
""", head)
    product = [c for c in cells if c.concurrency == 1]
    assert len(product) == 2 + 2  # plain × 2 tasks, dspark γ3 × 2 tasks (γ7 excluded); 3rd include is a duplicate
    added = cells[len(product):]
    assert keys(added, "drafter", "num_drafts", "policy", "task", "concurrency", "rate") == [
        ("dspark", 7, "static", "mt_bench", 8, None),  # include beats exclude; task = first value; load = default
        ("dspark", 3, "threshold", "mt_bench", 8, None),  # γ = first value; policy = defaults.policy
        ("dflash", 3, "full", "gsm8k", None, 2.5),
    ]


def test_static_longer_than_gamma_is_an_error_naming_the_exclude():
    text = MATRIX + "  backend: [inhouse]\n  drafter: [dspark]\n  num_drafts: [1, 3]\n  policy: [full, static3]\n" \
                    "  task: [gsm8k]\n  concurrency: [1]\n"
    assert error_of(text) == (f"s.yaml:{at(text, 'full, |static3')}: matrix.policy[1]: policy 'static3' verifies 3 "
                              f"drafts per step but num_drafts is 1 (drafter 'dspark'); exclude the combination: "
                              f"exclude: [{{policy: static3, num_drafts: 1}}]")
    cells = expand(parse_suite_text(text + "  exclude: [{policy: static3, num_drafts: 1}]\n"))
    assert keys(cells, "num_drafts", "policy") == [(1, "full"), (3, "full"), (3, "static")]


def test_confidence_policies_need_a_drafter_with_confidences():
    text = MATRIX + "  backend: [inhouse]\n  drafter: [none, dspark, dflash]\n  num_drafts: [3]\n" \
                    "  policy: [full, scheduler]\n  task: [gsm8k]\n  concurrency: [1]\n"
    assert error_of(text) == (f"s.yaml:{at(text, 'full, |scheduler')}: matrix.policy[1]: policy 'scheduler' (scheduler) "
                              f"reads draft confidences, which drafter 'dflash' (method dflash) does not give; exclude "
                              f"the combination: exclude: [{{drafter: dflash, policy: scheduler}}]")
    cells = expand(parse_suite_text(text + "  exclude: [{drafter: dflash, policy: scheduler}]\n"))
    assert keys(cells, "drafter", "policy") == [("none", "full"), ("dspark", "full"), ("dspark", "scheduler"),
                                                ("dflash", "full")]


def test_an_include_entry_that_cannot_run_is_an_error_at_the_entry():
    text = BASE + "  include: [{drafter: dflash, policy: thr07}]\n"
    assert error_of(text) == (f"s.yaml:{at(text, '[|{drafter: dflash')}: matrix.include[0]: policy 'thr07' (threshold) "
                              f"reads draft confidences, which drafter 'dflash' (method dflash) does not give; change "
                              f"this include entry")


@pytest.mark.parametrize("matrix, needle, rest", [
    ("  drafter: [none]\n  task: [gsm8k]\n  concurrency: [1]\n", "matrix",
     "matrix: no backend: give matrix.backend or defaults.backend (inhouse, vllm, sglang, openai)"),
    ("  backend: [inhouse]\n  drafter: [none]\n  concurrency: [1]\n", "matrix",
     "matrix: no task axis: 2 tasks are defined (gsm8k, mt_bench); list the ones to run in matrix.task or set "
     "defaults.task"),
    ("  backend: [inhouse]\n  task: [gsm8k]\n  concurrency: [1]\n", "matrix",
     "matrix: no drafter axis: 2 drafters are defined (dspark, dflash); list the ones to run in matrix.drafter or "
     "set defaults.drafter"),
    ("  backend: [inhouse]\n  drafter: [none]\n  task: [gsm8k]\n", "matrix",
     "matrix: no load: give matrix.concurrency (closed loop, conversations in flight) or matrix.rate (open loop, "
     "requests/s), or a default"),
    ("  backend: [inhouse]\n  drafter: [none, dspark]\n  task: [gsm8k]\n  concurrency: [1]\n", "dspark]",
     "matrix.drafter[1]: drafter 'dspark' drafts, so it needs num_drafts: give matrix.num_drafts or "
     "defaults.num_drafts"),
])
def test_missing_axes(matrix, needle, rest):
    text = MATRIX + matrix
    assert error_of(text) == f"s.yaml:{at(text, needle)}: {rest}"


def test_defaults_and_single_definitions_fill_missing_axes():
    head = MATRIX.replace("matrix:\n", "defaults: {backend: vllm, drafter: dspark, num_drafts: 5, rate: 4.0, "
                                       "warmup: 3, seed: 7}\nmatrix:\n")
    (cell,) = cells_of("  task: [gsm8k]\n", head)
    assert (cell.backend, cell.target.name, cell.drafter.name, cell.num_drafts, cell.rate, cell.concurrency,
            cell.warmup, cell.seed, cell.policy.name) == ("vllm", "tiny", "dspark", 5, 4.0, None, 3, 7, "full")


def test_dtype_auto_resolves_in_the_cell():
    from dspark_core.native_dtype import fast_dtype

    (cell,) = cells_of("  backend: [inhouse]\n  drafter: [none]\n  task: [gsm8k]\n  concurrency: [1]\n",
                       MATRIX.replace("tiny: {path: embedded}", "tiny: {path: embedded, dtype: auto}"))
    assert cell.target.dtype == fast_dtype() != "auto"


def test_cells_carry_the_definitions():
    head = MATRIX.replace("matrix:\n", "sla: {ttft_s: 2.0}\nbackend_options: {inhouse: {num_slots: 64}, "
                                       "vllm: {tags: [a, b]}}\nmatrix:\n")
    cell = cells_of("  backend: [inhouse]\n  drafter: [dspark]\n  num_drafts: [3]\n  policy: [thr07]\n"
                    "  task: [mt_bench]\n  concurrency: [2]\n", head)[0]
    assert cell.target.path == "embedded" and cell.target.dtype == "float32"
    assert (cell.drafter.method, cell.drafter.checkpoint, cell.drafter.head) == ("dspark", "embedded:dspark", None)
    assert (cell.task.n_samples, cell.task.max_new_tokens, cell.task.multi_turn) == (2, 8, True)
    assert (cell.policy.name, cell.policy.threshold) == ("threshold", 0.7)
    assert cell.sla is not None and cell.sla.ttft_s == 2.0
    assert cell.backend_options == (("num_slots", 64),)
    hash(cell)
    (flagged,) = cells_of("  backend: [vllm]\n  drafter: [dspark]\n  num_drafts: [3]\n  task: [mt_bench]\n"
                          "  concurrency: [2]\n", head)
    assert flagged.backend_options == (("tags", ("a", "b")),)  # a server flag's list, frozen


def test_ids_are_stable_across_loads_and_key_order():
    reordered = """\
matrix:
  concurrency: [1, 4]
  task: [gsm8k]
  num_drafts: [3, 7]
  drafter: [none, dspark]
  backend: [inhouse]
policies:
  static3: {verify_length: 3, name: static}
  thr07: {threshold: 0.7, name: threshold}
tasks:
  mt_bench: {temperature: 0.5, max_new_tokens: 8, n_samples: 2}
  gsm8k: {max_new_tokens: 8, n_samples: 4}
drafters:
  dflash: {checkpoint: "embedded:dflash", method: dflash}
  dspark: {checkpoint: "embedded:dspark", method: dspark}
targets:
  tiny: {path: embedded}
name: tiny
version: 1
"""
    a, b, c = parse_suite_text(BASE), parse_suite_text(BASE), parse_suite_text(reordered)
    ids = [cell.cell_id for cell in expand(a)]
    assert ids == [cell.cell_id for cell in expand(b)] == [cell.cell_id for cell in expand(c)]
    assert a.hash == c.hash and a.resolved_text == c.resolved_text
    assert ids[:2] == [expand(a)[0].cell_id, expand(a)[1].cell_id]


def test_expand_does_no_io(monkeypatch):
    suite = parse_suite_text(BASE)
    before = [c.cell_id for c in expand(suite)]

    def no_io(*args, **kwargs):
        raise AssertionError("expand touched the disk")

    monkeypatch.setattr(builtins, "open", no_io)
    for name in ("exists", "is_file", "is_dir", "stat", "read_text", "iterdir", "glob"):
        monkeypatch.setattr(Path, name, no_io)
    monkeypatch.setattr(os.path, "exists", no_io)
    monkeypatch.setattr(os, "listdir", no_io)
    assert [c.cell_id for c in expand(suite)] == before


# --- select (--only) ------------------------------------------------------------------------------------

@pytest.fixture
def grid() -> list[Cell]:
    return cells_of("""\
  backend: [inhouse, vllm]
  drafter: [none, dspark, dflash]
  num_drafts: [3, 7]
  task: [gsm8k, mt_bench]
  concurrency: [1, 4]
  rate: [2.5]
""")


def test_select_one_axis(grid):
    chosen = select(grid, ["drafter=dspark"])
    assert chosen and all(c.drafter.name == "dspark" for c in chosen)
    assert chosen == [c for c in grid if c.drafter.name == "dspark"]  # order kept
    assert select(grid, []) == grid


def test_select_same_axis_or_different_axes_and(grid):
    both = select(grid, ["drafter=dspark", "drafter=dflash"])
    assert both == select(grid, ["drafter=dspark,dflash"])
    assert {c.drafter.name for c in both} == {"dspark", "dflash"}
    chosen = select(grid, ["drafter=dspark,none", "gamma=7", "gamma=0", "backend=vllm", "concurrency=4"])
    assert {(c.drafter.name, c.num_drafts, c.backend, c.concurrency) for c in chosen} == {
        ("dspark", 7, "vllm", 4), ("none", 0, "vllm", 4)}
    assert len(chosen) == 2 * 2  # two tasks each


def test_select_numeric_axes_compare_as_numbers(grid):
    assert select(grid, ["num_drafts=3"]) == select(grid, ["gamma=3.0"])
    assert {c.rate for c in select(grid, ["rate=2.5"])} == {2.5}
    assert {c.task.name for c in select(grid, ["temperature=0"])} == {"gsm8k"}  # mt_bench runs at 0.5
    assert {c.drafter.method for c in select(grid, ["method=dflash"])} == {"dflash"}
    assert {c.task.name for c in select(grid, ["task=mt_bench"])} == {"mt_bench"}
    assert {c.policy.name for c in select(grid, ["policy=full"])} == {"full"}


@pytest.mark.parametrize("only, message", [
    (["drafer=dspark"], "--only 'drafer=dspark': unknown axis 'drafer' (did you mean 'drafter'?); valid: backend, "
                        "target, drafter, method, num_drafts, task, temperature, concurrency, rate, policy, gamma"),
    (["dspark"], "--only 'dspark': expected AXIS=VALUE, e.g. drafter=dspark"),
    (["drafter="], "--only 'drafter=': expected AXIS=VALUE, e.g. drafter=dspark"),
    (["drafter=dspak"], "--only drafter=dspak: no cell has drafter 'dspak' (did you mean 'dspark'?); values: dflash, "
                        "dspark, none"),
    (["gamma=5"], "--only num_drafts=5: no cell has num_drafts 5; values: 0, 3, 7"),
    (["gamma=three"], "--only 'gamma=three': num_drafts is a number, got 'three'"),
])
def test_select_errors(grid, only, message):
    with pytest.raises(SuiteError) as e:
        select(grid, only)
    assert str(e.value) == message
