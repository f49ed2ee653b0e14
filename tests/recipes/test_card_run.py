"""The card run of a draft build: stamped with the drafts' fingerprint, reused or resumed by `--resume` only
for those same drafts and that same suite, and never rendered from an interrupted run; measured again on the
drafts as they are (`python -m recipes.real.card`), its figures judged against the card it replaces, the run and
the machine recorded, the build's own run kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.runner import RunOutcome
from recipes.real import build as real_build
from recipes.real.card import main, remeasure, write_card

CARD = """\
version: 1
name: tiny-card
targets:
  embedded: {path: embedded}
drafters:
  none: {method: none}
  ngram: {method: ngram}
tasks:
  gsm8k: {n_samples: 3, max_new_tokens: 12, temperature: 0}
defaults: {backend: inhouse, warmup: 0, repeats: 1, policy: full}
backend_options:
  inhouse: {num_threads: 1, max_context: 512}
matrix:
  target: [embedded]
  drafter: [none, ngram]
  num_drafts: [3]
  task: [gsm8k]
  concurrency: [%s]
validity: {min_requests: 1, min_duration_s: 0.0, max_failed_fraction: 0.0}
"""


def test_drafts_fingerprint_follows_every_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.safetensors").write_bytes(b"one")
    first = real_build.drafts_fingerprint(tmp_path)
    (tmp_path / "a" / "model.safetensors").write_bytes(b"two")
    assert real_build.drafts_fingerprint(tmp_path) != first


def test_a_finished_card_run_of_the_same_drafts_is_kept_and_other_drafts_or_suites_run_anew(tmp_path, data_env):
    suite, db, log = tmp_path / "card.yaml", tmp_path / "card.duckdb", []
    suite.write_text(CARD % "1")
    first = real_build.run_card(suite, db, data_dir=None, log=log.append, drafts="d1")
    assert real_build.run_card(suite, db, data_dir=None, log=log.append, drafts="d1", resume=True) == first
    assert "kept from an earlier run" in log[-1]
    other = real_build.run_card(suite, db, data_dir=None, log=log.append, drafts="d2", resume=True)
    assert other != first  # retrained drafts: measured again
    suite.write_text(CARD % "2")
    assert real_build.run_card(suite, db, data_dir=None, log=log.append, drafts="d1", resume=True) not in (first, other)
    assert real_build.run_card(suite, db, data_dir=None, log=log.append, drafts="d1") != first  # no --resume: a new run


def test_an_interrupted_card_run_raises_and_is_resumed_next_time(tmp_path, data_env, monkeypatch):
    """The runner stands in for a run cut short by a signal (run_suite's own interruption is tested in
    tests/harness/test_runner.py); the resumed call must name that run."""
    suite, db = tmp_path / "card.yaml", tmp_path / "card.duckdb"
    suite.write_text(CARD % "1")
    first = real_build.run_card(suite, db, data_dir=None, log=lambda _: None, drafts="d1")
    from harness.store import Store

    with Store.open(db) as store:
        store.set_run_status(first, "interrupted")
    calls = []

    def interrupted_run(path, **kwargs):
        calls.append(kwargs.get("resume"))
        return RunOutcome(run_id=kwargs.get("resume") or "r-new", outcomes=[], interrupted=True)

    monkeypatch.setattr("harness.runner.run_suite", interrupted_run)
    with pytest.raises(RuntimeError, match="interrupted; no card was written"):
        real_build.run_card(suite, db, data_dir=None, log=lambda _: None, drafts="d1", resume=True)
    assert calls == [first]
    assert Path(db).is_file()


BUILD = {"target": "embedded", "out_dir": "tiny", "target_source": {}, "preset": "reduced", "seed": 0,
         "num_threads": 1, "dtype": "float32", "cpu": "AVX512", "seconds": {"drafts": 1.0, "card": 2.0},
         "resumed": False, "corpus": "0" * 64, "torch": "2.13.0", "training_budget": "none"}


@pytest.fixture
def built(tmp_path, data_env):
    """A build directory as `recipes.real.build` leaves it: drafts, card suite, build record, card from its run."""
    root = tmp_path / "tiny"
    (root / "drafts" / "ngram").mkdir(parents=True)
    (root / "drafts" / "ngram" / "draft_config.json").write_text("{}")
    (root / "card.yaml").write_text(CARD % "1")
    run_id = real_build.run_card(root / "card.yaml", root / "card.duckdb", data_dir=None, log=lambda _: None,
                                 drafts=real_build.drafts_fingerprint(root / "drafts"))
    (root / "build.json").write_text(json.dumps({"build": BUILD, "drafts": [], "card_run": run_id}))
    write_card(root)
    return root, run_id


def test_a_card_measured_again_replaces_the_figures_and_says_where_they_came_from(built):
    root, first = built
    assert f"Measured by harness run `{first}`, the build's own card run." in (root / "MODEL_CARD.md").read_text()
    result = remeasure(root, log=lambda _: None)
    data = json.loads((root / "build.json").read_text())
    again = data["card_measurement"]
    assert data["build_card_run"] == first and data["card_run"] == again["run"] != first
    assert again["cores"] >= 1 and again["cpu_model"] and again["seconds"] > 0 and "dirty" in again
    card = (root / "MODEL_CARD.md").read_text()
    assert f"Measured by harness run `{again['run']}`" in card and f"the build's own card run was `{first}`" in card
    # Same drafts, same prompts, greedy: n-gram's τ and α_k are the same walk, so they sit inside the old intervals.
    assert result.same_drafts and result.reproduced and result.names == ("previous", "re-measured")
    taus = [c for c in result.checks if c.figure == "tau"]
    assert len(taus) == 1 and taus[0].rebuilt == pytest.approx(taus[0].committed)
    assert {c.figure for c in result.judged} >= {"tau", "alpha_1"}

    # A second time keeps the build's own run, not the first re-measurement, as the one the build made.
    remeasure(root, log=lambda _: None)
    assert json.loads((root / "build.json").read_text())["build_card_run"] == first


def test_the_command_judges_against_the_old_card_and_names_what_is_missing(built, capsys, tmp_path):
    root, _ = built
    assert main([str(root)]) == 0
    out = capsys.readouterr().out
    assert "rendered from the new run" in out and "reproduced:" in out and "differ from the previous card" in out
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "card.yaml: missing; a card is measured on a build's drafts" in capsys.readouterr().err


def test_a_refitted_calibration_is_said_on_the_card_and_needs_a_build(built, tmp_path, capsys):
    from recipes.real.calibrate import main as calibrate_main

    root, _ = built
    data = json.loads((root / "build.json").read_text())
    data["calibration_refit"] = {"drafts": ["dspark"], "torch": "2.13.0", "cpu": "AVX512"}
    (root / "build.json").write_text(json.dumps(data))
    write_card(root)
    assert "The calibration of dspark (the STS temperatures and level offsets" in (root / "MODEL_CARD.md").read_text()
    (tmp_path / "empty").mkdir()
    assert calibrate_main([str(tmp_path / "empty")]) == 2
    assert "build.json: missing; a calibration is fitted on a build's drafts" in capsys.readouterr().err
