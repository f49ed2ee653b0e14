"""Task registry, loaders, subsets, content hashes and prompt rendering (all CPU, no network)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from inputs.tasks import (DATA_DIR_ENV, TASKS_DIR_ENV, DataNotFoundError, TaskConfigError, TaskSample, TaskSpec,
                           UnknownTaskError, content_hash, get_task, gsm8k_train_pairs, list_tasks, load_task,
                           prompt_ids, render_messages, select_subset, tokenize_messages)

REPO_ROOT = Path(__file__).resolve().parents[2]
GSM8K_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.delenv(TASKS_DIR_ENV, raising=False)


@pytest.fixture
def data_dir(monkeypatch) -> Path:
    """The shared datasets checkout beside the repo, via $HARNESS_DATA_DIR; skipped when absent."""
    path = REPO_ROOT.parent / "shared" / "datasets"
    if not (path / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"shared datasets not found at {path}")
    monkeypatch.setenv(DATA_DIR_ENV, str(path))
    return path


@pytest.fixture(scope="module")
def chat_tokenizer():
    """A byte-level BPE trained here on a few strings, with a minimal Jinja chat template (no hub)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|user|>", "<|assistant|>", "<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Please reason step by step", "Complete the following python code",
                             "Janet's ducks lay 16 eggs per day"], trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>")
    hf.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return hf


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


# --- registry -----------------------------------------------------------------------------------------

def test_builtin_tasks():
    assert {"gsm8k", "humaneval", "mt_bench"} <= set(list_tasks())
    gsm8k, humaneval, mt_bench = get_task("gsm8k"), get_task("humaneval"), get_task("mt_bench")
    assert (gsm8k.category, gsm8k.dataset, gsm8k.split, gsm8k.turns) == ("math", "gsm8k", "test", 1)
    assert gsm8k.format_prompt("Q?") == "Q?" + GSM8K_SUFFIX
    assert humaneval.category == "code"
    assert humaneval.format_prompt("def f():\n") == "Complete the following python code:\ndef f():\n"
    assert (mt_bench.category, mt_bench.turns) == ("chat", 2)
    assert mt_bench.format_prompt("as-is {x}") == "as-is {x}"
    for spec in (gsm8k, humaneval, mt_bench):
        assert spec.version >= 1 and spec.max_new_tokens > 0


def test_unknown_task_lists_valid_names():
    with pytest.raises(UnknownTaskError) as e:
        get_task("gsm8kk")
    msg = str(e.value)
    assert "'gsm8kk'" in msg and "did you mean 'gsm8k'" in msg
    for name in ("gsm8k", "humaneval", "mt_bench"):
        assert name in msg
    assert TASKS_DIR_ENV in msg


# --- loaders ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, count", [("gsm8k", 1319), ("humaneval", 164), ("mt_bench", 80)])
def test_counts(data_dir, name, count):
    task = load_task(name, hub=False)
    assert len(task) == count == len({s.id for s in task.samples})
    assert task.n_samples is None


def test_gsm8k_first_sample(data_dir):
    first = load_task("gsm8k", hub=False).samples[0]
    assert first.id == "test/0"
    assert first.turns[0].startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert first.reference == "18"
    assert first.metadata["solution"].endswith("#### 18")


def test_gsm8k_train_pairs(data_dir):
    pairs = gsm8k_train_pairs()
    assert len(pairs) == 7473
    question, answer = pairs[0]
    assert question.startswith("Natalia sold clips to 48 of her friends in April")
    assert answer.startswith("Natalia sold 48/2 = <<48/2=24>>24 clips in May.") and answer.endswith("#### 72")


def test_humaneval_first_sample(data_dir):
    first = load_task("humaneval", hub=False).samples[0]
    assert first.id == "HumanEval/0"
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in first.turns[0]
    assert first.reference.startswith("    for idx, elem in enumerate(numbers):")
    assert first.metadata["entry_point"] == "has_close_elements"
    assert "def check(candidate):" in first.metadata["test"]


def test_mt_bench_two_turns(data_dir):
    task = load_task("mt_bench", hub=False)
    first = task.samples[0]
    assert first.id == "81" and first.metadata["category"] == "writing"
    assert first.turns == (
        "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
        "and must-see attractions.",
        "Rewrite your previous response. Start every sentence with the letter A.")
    assert all(len(s.turns) == 2 for s in task.samples)
    by_id = {s.id: s for s in task.samples}
    # reference_answer/gpt-4.jsonl wins where present; else the question's own reference field.
    assert by_id["101"].references[0].startswith("If you have just overtaken the second person")
    assert len(by_id["95"].references) == 2 and by_id["95"].references[1].startswith("It means")
    assert by_id["81"].references == ()

    # The runner plays turn 1, appends the model's own answer, then plays turn 2.
    assert render_messages(task.spec, first) == [{"role": "user", "content": first.turns[0]}]
    assert render_messages(task.spec, first, ["Aloha!"]) == [
        {"role": "user", "content": first.turns[0]},
        {"role": "assistant", "content": "Aloha!"},
        {"role": "user", "content": first.turns[1]},
    ]
    with pytest.raises(ValueError, match="no next user turn"):
        render_messages(task.spec, first, ["a", "b"])


@pytest.mark.parametrize("name, files", [
    ("gsm8k", ["gsm8k/test.jsonl"]),
    ("humaneval", ["humaneval/HumanEval.jsonl.gz"]),
    ("mt_bench", ["mt_bench/question.jsonl", "mt_bench/reference_answer/gpt-4.jsonl"]),
])
def test_missing_data_names_files_and_env_var(tmp_path, name, files):
    with pytest.raises(DataNotFoundError) as e:
        load_task(name, data_dir=tmp_path, hub=False)
    msg = str(e.value)
    assert DATA_DIR_ENV in msg and str(tmp_path) in msg
    for f in files:
        assert f"<{DATA_DIR_ENV}>/{f}" in msg


def test_missing_data_without_data_dir_says_to_set_it():
    with pytest.raises(DataNotFoundError, match=f"not set \\(set {DATA_DIR_ENV}"):
        gsm8k_train_pairs(hub=False)


def test_hub_failure_becomes_our_error(tmp_path, monkeypatch):
    from inputs.tasks import sources

    def offline(path, name, split):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(sources, "_hub_rows", offline)
    with pytest.raises(DataNotFoundError) as e:
        load_task("humaneval", data_dir=tmp_path)
    msg = str(e.value)
    assert "openai/openai_humaneval" in msg and "ConnectionError" in msg
    assert f"<{DATA_DIR_ENV}>/humaneval/HumanEval.jsonl.gz" in msg


def test_real_hub_offline_becomes_our_error(tmp_path):
    """The real `datasets` path with HF_DATASETS_OFFLINE=1 and an empty cache (or without `datasets`)."""
    code = ("from inputs.tasks import DataNotFoundError, load_task\n"
            "try:\n    load_task('gsm8k')\n"
            "except DataNotFoundError as e:\n    print(e)\n    raise SystemExit(0)\n"
            "raise SystemExit('no error raised')\n")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           DATA_DIR_ENV: str(tmp_path / "empty"), "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "openai/gsm8k (main)" in out.stdout
    assert f"<{DATA_DIR_ENV}>/gsm8k/test.jsonl" in out.stdout


# --- subsets and hashes -------------------------------------------------------------------------------

def test_subsets_are_deterministic_and_hashed(data_dir):
    a = load_task("gsm8k", n_samples=20, seed=0, hub=False)
    b = load_task("gsm8k", n_samples=20, seed=0, hub=False)
    assert len(a) == 20 and a.samples == b.samples and a.content_hash == b.content_hash
    assert len(a.content_hash) == 64

    other_seed = load_task("gsm8k", n_samples=20, seed=1, hub=False)
    other_n = load_task("gsm8k", n_samples=21, seed=0, hub=False)
    full = load_task("gsm8k", hub=False)
    assert {s.id for s in other_seed.samples} != {s.id for s in a.samples}
    assert len({a.content_hash, other_seed.content_hash, other_n.content_hash, full.content_hash}) == 4
    # A larger n with the same seed extends the smaller subset; samples stay in dataset order.
    assert {s.id for s in a.samples} < {s.id for s in other_n.samples}
    indices = [int(s.id.split("/")[1]) for s in a.samples]
    assert indices == sorted(indices)
    # More than there are means all of them.
    assert load_task("mt_bench", n_samples=500, hub=False).content_hash == load_task("mt_bench", hub=False).content_hash


def test_subset_independent_of_python_hash_seed(data_dir):
    code = "from inputs.tasks import load_task; t = load_task('humaneval', n_samples=7, seed=3, hub=False); " \
           "print(t.content_hash, *[s.id for s in t.samples])"
    outs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO_ROOT)}
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=60, check=True)
        outs.add(out.stdout.strip())
    here = load_task("humaneval", n_samples=7, seed=3, hub=False)
    assert outs == {" ".join([here.content_hash, *[s.id for s in here.samples]])}


def _toy_samples(n: int) -> list[TaskSample]:
    return [TaskSample(id=f"q{i}", turns=(f"question {i}",), references=(str(i),)) for i in range(n)]


def test_select_subset_depends_on_ids_not_order():
    samples = _toy_samples(50)
    shuffled = samples[:]
    random.Random(0).shuffle(shuffled)
    picked = select_subset(samples, 10, seed=7)
    assert {s.id for s in select_subset(shuffled, 10, seed=7)} == {s.id for s in picked}
    assert select_subset(samples, None, seed=7) == tuple(samples)
    with pytest.raises(ValueError):
        select_subset(samples, 0, seed=7)


def test_content_hash_covers_template_version_and_content():
    spec = TaskSpec(name="toy", version=1, category="math", dataset="jsonl")
    samples = _toy_samples(5)
    h = content_hash(spec, samples)
    assert content_hash(TaskSpec(name="renamed", version=1, category="math", dataset="gsm8k"), samples) == h
    assert content_hash(TaskSpec(name="toy", version=2, category="math", dataset="jsonl"), samples) != h
    assert content_hash(TaskSpec(name="toy", version=1, category="math", dataset="jsonl",
                                 prompt_template="Q: {input}"), samples) != h
    edited = [*samples[:4], TaskSample(id="q4", turns=("question 4!",), references=("4",))]
    assert content_hash(spec, edited) != h
    assert content_hash(spec, samples[::-1]) != h


# --- custom tasks without code changes ----------------------------------------------------------------

def test_custom_yaml_task_in_tasks_dir(data_dir, tmp_path, monkeypatch):
    _write(tmp_path / "tasks" / "gsm8k_terse.yaml", """
        include: gsm8k
        version: 3
        prompt_template: "Answer with a number only: {input}"
        max_new_tokens: 32
        """)
    monkeypatch.setenv(TASKS_DIR_ENV, str(tmp_path / "tasks"))
    assert {"gsm8k", "gsm8k_terse"} <= set(list_tasks())
    spec = get_task("gsm8k_terse")
    assert (spec.name, spec.version, spec.category, spec.dataset, spec.max_new_tokens) == \
        ("gsm8k_terse", 3, "math", "gsm8k", 32)
    task = load_task("gsm8k_terse", n_samples=5, seed=0, hub=False)
    base = load_task("gsm8k", n_samples=5, seed=0, hub=False)
    assert [s.id for s in task.samples] == [s.id for s in base.samples]
    assert task.content_hash != base.content_hash
    assert render_messages(task.spec, task.samples[0])[0]["content"] == \
        "Answer with a number only: " + task.samples[0].turns[0]


def test_custom_jsonl_task(tmp_path, monkeypatch):
    rows = [{"qid": "a", "prompt": "What is 2+2?", "answer": "4"},
            {"qid": "b", "prompt": ["Name a colour.", "Another one?"], "answer": ["red", "blue"]}]
    _write(tmp_path / "data" / "mine" / "toy.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    _write(tmp_path / "tasks" / "toy.yaml", """
        version: 1
        category: chat
        dataset: jsonl
        dataset_args: {data_file: mine/toy.jsonl, input_field: prompt, reference_field: answer, id_field: qid}
        """)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    task = load_task("toy", tasks_dirs=tmp_path / "tasks")
    assert [s.id for s in task.samples] == ["a", "b"]
    assert task.samples[0].turns == ("What is 2+2?",) and task.samples[0].reference == "4"
    assert task.samples[1].turns == ("Name a colour.",)  # turns: 1 by default; the second is not played
    with pytest.raises(DataNotFoundError, match="mine/toy.jsonl"):
        load_task("toy", tasks_dirs=tmp_path / "tasks", data_dir=tmp_path / "elsewhere")


def test_custom_loader_module(tmp_path, monkeypatch):
    _write(tmp_path / "my_loader.py", """
        from inputs.tasks import TaskSample

        def load(split, *, data_dir=None, hub=True, count=3):
            return [TaskSample(id=f"{split}-{i}", turns=(f"say {i}", f"again {i}")) for i in range(count)]
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    _write(tmp_path / "tasks" / "echo.yaml", """
        version: 1
        category: chat
        dataset: "my_loader:load"
        split: dev
        turns: 2
        dataset_args: {count: 4}
        """)
    task = load_task("echo", tasks_dirs=[tmp_path / "tasks"])
    assert [s.id for s in task.samples] == ["dev-0", "dev-1", "dev-2", "dev-3"]
    assert task.samples[2].turns == ("say 2", "again 2")


@pytest.mark.parametrize("body, match", [
    ("version: 1\ncategory: math\ndataset: gsm8k\npromt_template: '{input}'\n", "did you mean 'prompt_template'"),
    ("version: 1\ncategory: maths\ndataset: gsm8k\n", "did you mean 'math'"),
    ("version: 1\ncategory: math\ndataset: gsm8k\nprompt_template: 'no placeholder'\n", "must contain \\{input\\}"),
    ("category: math\ndataset: gsm8k\n", "missing required key\\(s\\) version"),
    ("version: 1\ncategory: math\ndataset: gsm8k\nturns: 0\n", "turns must be a positive integer"),
    ("include: bad\nversion: 2\n", "include cycle: bad -> bad"),
    ("- not\n- a mapping\n", "must be a mapping"),
])
def test_bad_task_files(tmp_path, body, match):
    (tmp_path / "bad.yaml").write_text(body, encoding="utf-8")
    with pytest.raises(TaskConfigError, match=match):
        get_task("bad", tasks_dirs=tmp_path)


def test_bad_dataset_references(tmp_path):
    _write(tmp_path / "args.yaml", "version: 1\ncategory: math\ndataset: jsonl\ndataset_args: {data_fle: x}\n")
    _write(tmp_path / "nods.yaml", "version: 1\ncategory: math\ndataset: gsm8kk\n")
    with pytest.raises(TaskConfigError, match="no argument 'data_fle'; did you mean 'data_file'"):
        load_task("args", tasks_dirs=tmp_path, hub=False)
    with pytest.raises(TaskConfigError, match="unknown dataset 'gsm8kk'; did you mean 'gsm8k'"):
        load_task("nods", tasks_dirs=tmp_path, hub=False)


def test_duplicate_task_name_and_missing_tasks_dir(tmp_path, monkeypatch):
    _write(tmp_path / "gsm8k.yaml", "version: 1\ncategory: math\ndataset: gsm8k\n")
    with pytest.raises(TaskConfigError, match="defined twice"):
        list_tasks(tmp_path)
    monkeypatch.setenv(TASKS_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(TaskConfigError, match=f"does not exist.*{TASKS_DIR_ENV}"):
        list_tasks()


# --- chat template ------------------------------------------------------------------------------------

def test_prompt_ids_through_chat_template(data_dir, chat_tokenizer):
    task = load_task("gsm8k", n_samples=3, seed=0, hub=False)
    sample = task.samples[0]
    ids = prompt_ids(chat_tokenizer, task.spec, sample)
    assert all(isinstance(t, int) for t in ids)
    assert chat_tokenizer.decode(ids) == f"<|user|>{sample.turns[0]}{GSM8K_SUFFIX}<|end|><|assistant|>"
    assert ids[0] == chat_tokenizer.convert_tokens_to_ids("<|user|>")
    assert ids[-1] == chat_tokenizer.convert_tokens_to_ids("<|assistant|>")


def test_second_turn_ids_follow_first_answer(data_dir, chat_tokenizer):
    task = load_task("mt_bench", n_samples=2, seed=0, hub=False)
    sample = task.samples[0]
    turn1 = prompt_ids(chat_tokenizer, task.spec, sample)
    turn2 = prompt_ids(chat_tokenizer, task.spec, sample, answers=["My answer."])
    assert chat_tokenizer.decode(turn2) == (f"<|user|>{sample.turns[0]}<|end|><|assistant|>My answer.<|end|>"
                                            f"<|user|>{sample.turns[1]}<|end|><|assistant|>")
    assert turn2[: len(turn1) - 1] == turn1[:-1]  # same prefix up to the generation prompt


def test_tokenizer_without_chat_template(chat_tokenizer):
    from transformers import PreTrainedTokenizerFast

    plain = PreTrainedTokenizerFast(tokenizer_object=chat_tokenizer.backend_tokenizer)
    with pytest.raises(ValueError, match="no chat_template"):
        tokenize_messages(plain, [{"role": "user", "content": "hi"}])
