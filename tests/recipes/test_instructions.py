"""The real build's open-ended chat instructions: fixed, distinct, enough for its preset, and none from MT-Bench."""

import json
import os
import re
from pathlib import Path

import pytest

from recipes.embedded.instructions import SUBJECTS, TEMPLATES, count, instruction_prompts
from recipes.real.build import PRESETS


def test_the_list_is_fixed_distinct_and_a_prefix_for_any_length():
    every = instruction_prompts(count())
    assert len(set(every)) == count() == sum(len(SUBJECTS[kind]) for kind, _ in TEMPLATES)
    assert instruction_prompts(40) == every[:40] and instruction_prompts(0) == []
    # hash order mixes the kinds: the first few dozen already hold every template kind
    kinds = {kind for kind, template in TEMPLATES for text in every[:40] if re.fullmatch(re.escape(template).replace(r"\{\}", ".+"), text)}
    assert kinds == set(SUBJECTS)
    with pytest.raises(ValueError, match="there are"):
        instruction_prompts(count() + 1)


def test_every_preset_asks_for_no_more_than_there_are():
    for name, preset in PRESETS.items():
        assert preset.drafts.instruction_prompts <= count(), name


def _shingles(text: str, n: int = 6) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_no_instruction_shares_six_words_in_a_row_with_an_mt_bench_question(data_env):
    questions = [json.loads(line) for line in (Path(os.environ["HARNESS_DATA_DIR"]) / "mt_bench" / "question.jsonl").open()]
    mt_bench = set().union(*(_shingles(t) for q in questions for t in q["turns"]))
    assert len(mt_bench) > 1000
    shared = {text for text in instruction_prompts(count()) if _shingles(text) & mt_bench}
    assert not shared
