"""`synthetic_acceptance` on a drafter: a list of rates in [0, 1], on a drafting method, in-house only,
and the cells it makes carry it (and only they)."""

from __future__ import annotations

import math

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


def test_only_the_inhouse_and_vllm_backends_implement_it():
    text = SYNTH.replace("  backend: [inhouse]", "  backend: [sglang]")
    with pytest.raises(SuiteError, match="only the inhouse and vllm backends implement"):
        expand(parse_suite_text(text, "s.yaml"))


def test_vllm_gets_the_same_law_as_unconditional_rates_in_its_speculative_config():
    from backends.vllm.server import speculative_config
    from dspark_core.verification import synthetic_unconditional_rates

    cells = [c for c in expand(parse_suite_text(SYNTH.replace("  backend: [inhouse]", "  backend: [vllm]"), "s.yaml"))
             if c.is_synthetic]
    assert cells
    for cell in cells:
        config = speculative_config(cell)
        law = cell.drafter.synthetic_acceptance
        expected = [math.prod(law[min(j, len(law) - 1)] for j in range(k + 1)) for k in range(cell.num_drafts)]
        assert config["rejection_sample_method"] == "synthetic"
        assert config["synthetic_acceptance_rates"] == pytest.approx(expected)
        assert len(expected) == config["num_speculative_tokens"]
    assert synthetic_unconditional_rates([0.8, 0.5], 4) == pytest.approx([0.8, 0.4, 0.2, 0.1])
