"""The card run of a draft build: stamped with the drafts' fingerprint, reused or resumed by `--resume` only
for those same drafts and that same suite, and never rendered from an interrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runner import RunOutcome
from recipes.real import build as real_build

CARD = """\
version: 1
name: tiny-card
targets:
  embedded: {path: embedded}
drafters:
  none: {method: none}
tasks:
  gsm8k: {n_samples: 2, max_new_tokens: 6, temperature: 0}
defaults: {backend: inhouse, warmup: 0, repeats: 1}
backend_options:
  inhouse: {num_threads: 1, max_context: 512}
matrix:
  target: [embedded]
  drafter: [none]
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
