"""Each kind of bad suite gives one actionable line at the offending key or value.

Expected positions are written as the token the error must point at (`suite_fixtures.at`), so each test
states *what* is blamed, not a column counted by hand.
"""

from __future__ import annotations

import shutil

import pytest
from suite_fixtures import BASE, at, error_of, with_lines

from harness.gate.rules import GateRule, Validity
from harness.suite import parse_suite_text
from inputs.tasks.registry import BUILTIN_TASKS_DIR


def check(old: str, new: str, needle: str, rest: str) -> None:
    text = BASE.replace(old, new, 1)
    assert text != BASE
    assert error_of(text) == f"s.yaml:{at(text, needle)}: {rest}"


def test_base_parses():
    suite = parse_suite_text(BASE)
    assert suite.name == "tiny" and suite.version == 1 and suite.repeats == 1


# --- unknown keys -------------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, needle, rest", [
    ("{method: dspark,", "{methd: dspark,", "methd",
     "drafters.dspark.methd: unknown key 'methd' (did you mean 'method'?)"),
    ("name: tiny", "name: tiny\ngatez: {}", "gatez", "gatez: unknown key 'gatez' (did you mean 'gates'?)"),
    ("  concurrency: [1, 4]", "  concurency: [1, 4]", "concurency",
     "matrix.concurency: unknown key 'concurency' (did you mean 'concurrency'?)"),
    ("{n_samples: 4, max_new_tokens: 8}", "{n_samples: 4, max_new_tokens: 8, colour: red}", "colour",
     "tasks.gsm8k.colour: unknown key 'colour'; valid keys: n_samples, max_new_tokens, temperature, multi_turn, dataset"),
])
def test_unknown_keys_suggest_the_nearest(old, new, needle, rest):
    check(old, new, needle, rest)


# --- types --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, needle, rest", [
    ("n_samples: 4", "n_samples: four", "four", "tasks.gsm8k.n_samples: expected an integer, got 'four'"),
    ("n_samples: 4", "n_samples: 4.5", "4.5", "tasks.gsm8k.n_samples: expected an integer, got 4.5"),
    ("n_samples: 4", "n_samples: '4'", "'4'", "tasks.gsm8k.n_samples: expected an integer, got '4'"),
    ("n_samples: 4", "n_samples: true", "true", "tasks.gsm8k.n_samples: expected an integer, got true"),
    ("threshold: 0.7", "threshold: high", "high", "policies.thr07.threshold: expected a number, got 'high'"),
    ("name: tiny", "name: [tiny]", "[tiny]", "name: expected a string, got a list"),
    ("  tiny: {path: embedded}", "  tiny: embedded", "tiny: |embedded", "targets.tiny: expected a mapping, got 'embedded'"),
    ("temperature: 0.5}", "temperature: 0.5, multi_turn: yes please}", "yes please",
     "tasks.mt_bench.multi_turn: expected true or false, got 'yes please'"),
])
def test_wrong_types(old, new, needle, rest):
    check(old, new, needle, rest)


def test_an_integer_is_a_number():
    suite = parse_suite_text(BASE.replace("temperature: 0.5", "temperature: 1"))
    assert suite.tasks["mt_bench"].temperature == 1.0


# --- ranges -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, needle, rest", [
    ("n_samples: 4", "n_samples: 0", "n_samples: |0", "tasks.gsm8k.n_samples: must be at least 1, got 0"),
    ("max_new_tokens: 8}\n  mt", "max_new_tokens: 0}\n  mt", "max_new_tokens: |0",
     "tasks.gsm8k.max_new_tokens: must be at least 1, got 0"),
    ("temperature: 0.5", "temperature: -1", "-1", "tasks.mt_bench.temperature: must be at least 0.0, got -1"),
    ("num_drafts: [3, 7]", "num_drafts: [3, 40]", "40", "matrix.num_drafts[1]: must be at most 32, got 40"),
    ("num_drafts: [3, 7]", "num_drafts: [0]", "[|0]", "matrix.num_drafts[0]: must be at least 1, got 0"),
    ("concurrency: [1, 4]", "concurrency: [0]", "[|0]", "matrix.concurrency[0]: must be at least 1, got 0"),
    ("concurrency: [1, 4]", "rate: [0.0]", "0.0", "matrix.rate[0]: must be greater than 0.0, got 0.0"),
    ("threshold: 0.7", "threshold: 1.5", "1.5", "policies.thr07.threshold: must be less than 1.0, got 1.5"),
    ("threshold: 0.7", "threshold: 0", "threshold: |0", "policies.thr07.threshold: must be greater than 0.0, got 0"),
    ("verify_length: 3", "verify_length: 0", "verify_length: |0",
     "policies.static3.verify_length: must be at least 1, got 0"),
    ("name: tiny", "name: tiny\ndefaults: {repeats: 0}", "repeats: |0", "defaults.repeats: must be at least 1, got 0"),
    ("backend: [inhouse]", "backend: []", "[]",
     "matrix.backend: must not be empty (leave the axis out to use defaults)"),
])
def test_out_of_range(old, new, needle, rest):
    check(old, new, needle, rest)


# --- choices ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, needle, rest", [
    ("[inhouse]", "[vlm]", "vlm", "matrix.backend[0]: unknown backend 'vlm' (did you mean 'vllm'?); valid: "
                                  "inhouse, vllm, sglang, openai"),
    ("backend: [inhouse]", "backend: sglng", "sglng", "matrix.backend[0]: unknown backend 'sglng' (did you mean "
                                                      "'sglang'?); valid: inhouse, vllm, sglang, openai"),
    ("method: dspark", "method: dspak", "dspak", "drafters.dspark.method: unknown drafter method 'dspak' (did you "
                                                 "mean 'dspark'?); valid: none, dspark, dflash, eagle3, ngram, "
                                                 "draft_model"),
    ('"embedded:dspark"}', '"embedded:dspark", head: gru}', "gru",
     "drafters.dspark.head: unknown head 'gru'; valid: markov, gated, rnn"),
    ("{name: threshold,", "{name: treshold,", "treshold", "policies.thr07.name: unknown policy 'treshold' (did you "
                                                          "mean 'threshold'?); valid: full, static, threshold, "
                                                          "scheduler, budget, adaptive"),
    ("  tiny: {path: embedded}", "  tiny: {path: embedded, dtype: fp8}", "fp8",
     "targets.tiny.dtype: unknown dtype 'fp8'; valid: float32, bfloat16, float16, auto"),
])
def test_unknown_choices_list_the_valid_ones(old, new, needle, rest):
    check(old, new, needle, rest)


@pytest.mark.parametrize("gate, needle, rest", [
    ("{direction: up}", "up", "gates.acceptance_length.direction: unknown direction 'up'; valid: higher, lower"),
    ("{direction: higher, test: bootstrap}", "bootstrap", "gates.acceptance_length.test: unknown test 'bootstrap' "
                                                          "(did you mean 'paired_bootstrap'?); valid: "
                                                          "paired_bootstrap, mann_whitney, paired_rounds, threshold"),
    ("{direction: higher, level: error}", "error", "gates.acceptance_length.level: unknown level 'error'; valid: "
                                                   "fail, warn"),
    ("{direction: higher, alpha: 1.5}", "1.5", "gates.acceptance_length.alpha: must be less than 1.0, got 1.5"),
    ("{directon: higher}", "directon", "gates.acceptance_length.directon: unknown key 'directon' (did you mean "
                                       "'direction'?)"),
    ("{level: warn}", "acceptance_length", "gates.acceptance_length: missing required key 'direction'"),
    ("{direction: higher, relative: -0.1}", "-0.1", "gates.acceptance_length.relative: must be at least 0.0, got -0.1"),
])
def test_gate_errors(gate, needle, rest):
    text = BASE + f"gates:\n  acceptance_length: {gate}\n"
    assert error_of(text) == f"s.yaml:{at(text, needle)}: {rest}"


def test_gate_metric_names_are_identifiers():
    text = BASE + "gates:\n  tpot p50: {direction: lower}\n"
    assert error_of(text) == (f"s.yaml:{at(text, 'tpot p50')}: gates.tpot p50: a gate is keyed by a metric name "
                              f"(letters, digits, '_'), got 'tpot p50'")


def test_gates_validity_and_sla_become_contract_types():
    text = BASE + """\
gates:
  ece_calibrated: {direction: lower, relative: null, absolute: 0.02}
  acceptance_length: {direction: higher, test: paired_bootstrap, relative: 0.01, min_samples: 8, level: fail}
validity: {min_requests: 4, min_duration_s: 0.5}
sla: {ttft_s: 2.0}
"""
    suite = parse_suite_text(text)
    assert suite.gates == (
        GateRule(metric="acceptance_length", direction="higher", relative=0.01, min_samples=8),
        GateRule(metric="ece_calibrated", direction="lower", relative=None, absolute=0.02),
    )
    assert suite.validity == Validity(min_requests=4, min_duration_s=0.5)
    assert suite.sla is not None and (suite.sla.ttft_s, suite.sla.tpot_s) == (2.0, None)
    assert parse_suite_text(BASE).validity == Validity() and parse_suite_text(BASE).sla is None


# --- required keys and rules within an entry ----------------------------------------------------------

@pytest.mark.parametrize("old, new, needle, rest", [
    ("{n_samples: 4, max_new_tokens: 8}", "{n_samples: 4}", "gsm8k",
     "tasks.gsm8k: missing required key 'max_new_tokens'"),
    (', checkpoint: "embedded:dspark"}', "}", "method: |dspark}",
     "drafters.dspark.method: method dspark needs a checkpoint ('embedded:<name>', a local directory or a hub id)"),
    ("dflash: {method: dflash,", "dflash: {method: ngram,", "ngram, |checkpoint",
     "drafters.dflash.checkpoint: method ngram has no weights: remove checkpoint"),
    ('"embedded:dflash"}', '"embedded:dflash", head: rnn}', "head",
     "drafters.dflash.head: head applies to method dspark only, not dflash"),
    ('"embedded:dspark"}', '"embedded"}', '"embedded"', "drafters.dspark.checkpoint: an embedded draft is written "
                                                        "'embedded:<name>' (a directory of models/embedded/drafts/)"),
    ("{path: embedded}", "{path: 'embedded:dspark'}", "'embedded:dspark'",
     "targets.tiny.path: the embedded target is written 'embedded'; 'embedded:<name>' names a draft"),
    ("{name: static, verify_length: 3}", "{name: static}", "static}",
     "policies.static3.name: policy static needs verify_length (γ' drafts verified per step, 1..γ)"),
    ("{name: threshold, threshold: 0.7}", "{name: threshold}", "threshold}",
     "policies.thr07.name: policy threshold needs threshold (a confidence cut-off in (0, 1))"),
    ("{name: threshold, threshold: 0.7}", "{name: full, threshold: 0.7}", "full, |threshold",
     "policies.thr07.threshold: threshold applies to policy threshold only, not full"),
    ("{name: static, verify_length: 3}", "{name: full, verify_length: 3}", "verify_length",
     "policies.static3.verify_length: verify_length applies to policy static only, not full"),
    ("{name: threshold, threshold: 0.7}", "{name: threshold, threshold: 0.7, sps_table: t.json}", "sps_table",
     "policies.thr07.sps_table: sps_table applies to policies scheduler, budget, adaptive only, not threshold"),
    ("  tiny: {path: embedded}", "  tiny my: {path: embedded}", "tiny my",
     "targets.tiny my: names are letters, digits, '_', '.' and '-' (starting with a letter or digit), got 'tiny my'"),
    ("name: tiny", "name: tiny\nsla: {}", "{}", "sla: an sla sets ttft_s, tpot_s and/or min_user_tokens_per_s (leave sla out for none)"),
    ("name: tiny", "name: tiny\ndefaults: {concurrency: 1, rate: 2.0}", "rate",
     "defaults.rate: give concurrency (closed loop) or rate (open loop), not both"),
    ("  concurrency: [1, 4]", "  concurrency: [1, 4]\n  include: [{drafter: dspark, concurrency: 2, rate: 2.0}]", "rate",
     "matrix.include[0].rate: give concurrency (closed loop) or rate (open loop), not both"),
    ("  concurrency: [1, 4]", "  concurrency: [1, 4]\n  include: [{}]", "{}",
     "matrix.include[0]: an include entry names at least one axis (backend, target, drafter, num_drafts, task, "
     "temperature, concurrency, rate, policy)"),
    ("  concurrency: [1, 4]", "  concurrency: [1, 4]\n  exclude: [{}]", "{}",
     "matrix.exclude[0]: an exclude rule names at least one axis (an empty rule would drop every cell)"),
    ("name: tiny", "name: tiny\nbackend_options: {vllm: {spec: {a: 1}}}", "{a: 1}",
     "backend_options.vllm.spec: a backend option is a scalar or a list of scalars, got a mapping"),
    ("name: tiny", "name: tiny\nbackend_options: {vlm: {x: 1}}", "vlm",
     "backend_options.vlm: unknown backend 'vlm' (did you mean 'vllm'?); valid: inhouse, vllm, sglang, openai"),
])
def test_rules_within_an_entry(old, new, needle, rest):
    check(old, new, needle, rest)


# --- draft_model: the checkpoint is a Hugging Face causal LM ------------------------------------------

DRAFT_MODEL = BASE.replace('  dflash: {method: dflash, checkpoint: "embedded:dflash"}',
                           "  small: {method: draft_model, checkpoint: Qwen/Qwen3-0.6B}\n"
                           "  self: {method: draft_model, checkpoint: embedded}").replace(
    "drafter: [none, dspark]", "drafter: [none, small, self]")


def test_draft_model_takes_a_causal_lm_checkpoint():
    """A hub id, a directory, or `embedded` (the embedded target as its own draft); cells carry it."""
    from harness.suite import expand

    suite = parse_suite_text(DRAFT_MODEL)
    assert (suite.drafters["small"].method, suite.drafters["small"].checkpoint) == ("draft_model", "Qwen/Qwen3-0.6B")
    assert suite.drafters["self"].checkpoint == "embedded"
    cells = expand(suite)
    assert {(c.drafter.method, c.drafter.checkpoint) for c in cells if not c.is_plain} == {
        ("draft_model", "Qwen/Qwen3-0.6B"), ("draft_model", "embedded")}
    assert {c.num_drafts for c in cells if c.drafter.method == "draft_model"} == {3, 7}


@pytest.mark.parametrize("old, new, needle, rest", [
    (", checkpoint: Qwen/Qwen3-0.6B}", "}", "method: |draft_model}",
     "drafters.small.method: method draft_model needs a checkpoint ('embedded' for the embedded target, a local "
     "directory or a hub id)"),
    ("checkpoint: embedded}", 'checkpoint: "embedded:dspark"}', 'draft_model, checkpoint: |"embedded:dspark"}',
     "drafters.self.checkpoint: method draft_model drafts with a Hugging Face causal LM ('embedded' for the "
     "embedded target, a local directory or a hub id); 'embedded:<name>' names one of our DSpark/DFlash/Eagle3 drafts"),
    ("checkpoint: embedded}", "checkpoint: embedded, head: markov}", "head",
     "drafters.self.head: head applies to method dspark only, not draft_model"),
    ("drafter: [none, small, self]", "drafter: [none, small, self]\n  policy: [thr07]", "thr07]",
     "matrix.policy[0]: policy 'thr07' (threshold) reads draft confidences, which drafter 'small' (method "
     "draft_model) does not give; exclude the combination: exclude: [{drafter: small, policy: thr07}]"),
])
def test_draft_model_errors(old, new, needle, rest):
    text = DRAFT_MODEL.replace(old, new, 1)
    assert text != DRAFT_MODEL
    assert error_of(text) == f"s.yaml:{at(text, needle)}: {rest}"


def test_exclude_rules_match_the_draft_model_method():
    from harness.suite import expand

    text = DRAFT_MODEL.replace("  concurrency: [1, 4]", "  concurrency: [1, 4]\n  exclude: [{method: draft_model}]")
    assert {c.drafter.method for c in expand(parse_suite_text(text))} == {"none"}


def test_missing_top_level_key_points_at_the_file():
    assert error_of(BASE.replace("name: tiny\n", "")) == "s.yaml:1:1: missing required key 'name'"


# --- names that must refer to something -------------------------------------------------------------------

@pytest.mark.parametrize("old, new, needle, rest", [
    ("drafter: [none, dspark]", "drafter: [none, dspurk]", "dspurk",
     "matrix.drafter[1]: drafter 'dspurk' is not defined (did you mean 'dspark'?); defined: none, dspark, dflash "
     "(define it under drafters:)"),
    ("task: [gsm8k]", "task: [gsm8k, humaneval]", "humaneval",
     "matrix.task[1]: task 'humaneval' is not defined; defined: gsm8k, mt_bench (define it under tasks:)"),
    ("concurrency: [1, 4]", "concurrency: [1, 4]\n  target: [tiny, big]", "big",
     "matrix.target[1]: target 'big' is not defined; defined: tiny (define it under targets:)"),
    ("concurrency: [1, 4]", "concurrency: [1, 4]\n  policy: [full, thr7]", "thr7",
     "matrix.policy[1]: policy 'thr7' is not defined (did you mean 'thr07'?); defined: full, scheduler, budget, "
     "adaptive, thr07, static3 (define it under policies:)"),
    ("concurrency: [1, 4]", "concurrency: [1, 4]\n  policy: [static]", "static]",
     "matrix.policy[0]: policy 'static' needs parameters: define one under policies:, e.g. policies: "
     "{static3: {name: static, verify_length: 3}}"),
    ("concurrency: [1, 4]", "concurrency: [1, 4]\n  include: [{drafter: eagle}]", "eagle",
     "matrix.include[0].drafter: drafter 'eagle' is not defined; defined: none, dspark, dflash "
     "(define it under drafters:)"),
    ("concurrency: [1, 4]", "concurrency: [1, 4]\n  exclude: [{drafter: [dflash, dspork]}]", "dspork",
     "matrix.exclude[0].drafter[1]: drafter 'dspork' is not defined (did you mean 'dspark'?); defined: none, "
     "dspark, dflash (define it under drafters:)"),
    ("name: tiny", "name: tiny\ndefaults: {task: gsm9k}", "gsm9k",
     "defaults.task: task 'gsm9k' is not defined (did you mean 'gsm8k'?); defined: gsm8k, mt_bench "
     "(define it under tasks:)"),
    ("  gsm8k: {", "  gsm8kk: {", "gsm8kk",
     "tasks.gsm8kk: unknown task 'gsm8kk' (did you mean 'gsm8k'?); tasks: gsm8k, humaneval, mt_bench "
     "(a task is a YAML file in inputs/tasks/ or $HARNESS_TASKS_DIR)"),
    ("{name: threshold, threshold: 0.7}", "{name: threshold, threshold: 0.7}\n  full: {name: static, verify_length: 1}",
     "name: |static, verify_length: 1",
     "policies.full.name: a policy named after the built-in 'full' must be one (name: full), not 'static'"),
])
def test_undefined_names_list_the_defined_ones(old, new, needle, rest):
    check(old, new, needle, rest)


def test_user_task_files_are_valid_task_names(tmp_path, monkeypatch):
    shutil.copy(BUILTIN_TASKS_DIR / "gsm8k.yaml", tmp_path / "my_math.yaml")
    text = BASE.replace("  gsm8k: {", "  my_math: {").replace("task: [gsm8k]", "task: [my_math]")
    assert "unknown task 'my_math'" in error_of(text)
    assert parse_suite_text(text, tasks_dirs=[tmp_path]).tasks["my_math"].n_samples == 4
    monkeypatch.setenv("HARNESS_TASKS_DIR", str(tmp_path))
    assert parse_suite_text(text).matrix.task == ["my_math"]


def test_a_scalar_axis_is_a_one_value_list():
    assert parse_suite_text(with_lines(BASE, l15="  backend: inhouse")).matrix.backend == ["inhouse"]


def test_two_task_entries_can_run_one_dataset_at_two_sizes(tmp_path):
    from harness.suite import expand, load_suite

    path = tmp_path / "s.yaml"
    path.write_text(
        "version: 1\nname: s\ntargets: {t: {path: embedded}}\n"
        "tasks:\n  gsm8k: {n_samples: 4, max_new_tokens: 8}\n  gsm8k-burst: {dataset: gsm8k, n_samples: 16, max_new_tokens: 8}\n"
        "matrix:\n  backend: [inhouse]\n  target: [t]\n  task: [gsm8k]\n  concurrency: [1]\n"
        "  include:\n    - {task: gsm8k-burst, concurrency: 16}\n")
    cells = expand(load_suite(path))
    assert [(c.task.name, c.task.n_samples, c.concurrency) for c in cells] == [("gsm8k", 4, 1), ("gsm8k", 16, 16)]
    assert cells[0].cell_id != cells[1].cell_id


def test_an_unknown_dataset_is_named_at_its_line(tmp_path):
    from harness.suite import SuiteError, load_suite

    path = tmp_path / "s.yaml"
    path.write_text("version: 1\nname: s\ntargets: {t: {path: embedded}}\n"
                    "tasks:\n  burst: {dataset: gsm8kk, n_samples: 16, max_new_tokens: 8}\n"
                    "matrix:\n  target: [t]\n  task: [burst]\n")
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    assert str(e.value).startswith(f"{path}:5:") and "tasks.burst.dataset: unknown task 'gsm8kk' (did you mean 'gsm8k'?)" in str(e.value)
