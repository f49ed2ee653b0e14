"""`synthetic_acceptance` on a drafter: a list of rates in [0, 1], on a drafting method, in-house only,
and the cells it makes carry it (and only they)."""

from __future__ import annotations

import pytest
from suite_fixtures import BASE, error_of

from harness.suite import SuiteError, expand, parse_suite_text

SYNTH = BASE.replace('  dflash: {method: dflash, checkpoint: "embedded:dflash"}',
                     '  dflash: {method: dflash, checkpoint: "embedded:dflash"}\n'
                     '  fixed: {method: ngram, synthetic_acceptance: [0.8, 0.5]}').replace(
    "  drafter: [none, dspark]", "  drafter: [none, dspark, fixed]")


def test_synthetic_cells_carry_their_law():
    cells = expand(parse_suite_text(SYNTH, "s.yaml"))
    synthetic = [c for c in cells if c.is_synthetic]
    assert synthetic and all(c.drafter.name == "fixed" and c.drafter.synthetic_acceptance == (0.8, 0.5)
                             for c in synthetic)
    assert all("SYNTHETIC" in c.label() for c in synthetic)
    assert not any("SYNTHETIC" in c.label() for c in cells if not c.is_synthetic)


@pytest.mark.parametrize("law, message", [
    ("[1.5]", "synthetic_acceptance"),
    ("[]", "needs a drafting method and at least one rate"),
])
def test_bad_laws_are_refused(law, message):
    assert message in error_of(SYNTH.replace("[0.8, 0.5]", law))


def test_plain_decoding_cannot_be_synthetic():
    text = BASE.replace('  dflash: {method: dflash, checkpoint: "embedded:dflash"}',
                        '  dflash: {method: dflash, checkpoint: "embedded:dflash"}\n'
                        '  fake: {method: none, synthetic_acceptance: [0.5]}')
    assert "needs a drafting method" in error_of(text)


def test_only_the_inhouse_backend_implements_it():
    text = SYNTH.replace("  backend: [inhouse]", "  backend: [vllm]")
    with pytest.raises(SuiteError, match="only the inhouse backend implements"):
        expand(parse_suite_text(text, "s.yaml"))
