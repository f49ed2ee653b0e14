"""Where task data comes from: a local data directory in the datasets' original formats, else the
Hugging Face hub (through the optional `datasets` package), else a `DataNotFoundError` that says exactly
which files to put where.

The data directory is `data_dir=` when given, else the `HARNESS_DATA_DIR` environment variable. Layout
(each file exactly as its project publishes it):

    gsm8k/test.jsonl                      openai/grade-school-math: {"question", "answer"} per line
    gsm8k/train.jsonl                     same format
    humaneval/HumanEval.jsonl.gz          openai/human-eval: {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
    mt_bench/question.jsonl               lm-sys/FastChat llm_judge: {"question_id", "category", "turns", ["reference"]}
    mt_bench/reference_answer/gpt-4.jsonl optional; FastChat reference answers: {"question_id", "choices": [{"turns"}]}

Every loader has the signature `load(split, *, data_dir, hub, **dataset_args) -> list[TaskSample]`; a task
file names one by built-in name (`DATASETS`) or as "package.module:function".
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from inputs.tasks.spec import TaskSample

log = logging.getLogger(__name__)

DATA_DIR_ENV = "HARNESS_DATA_DIR"

# Built-in dataset name -> "module:function", resolved lazily by the registry.
DATASETS: dict[str, str] = {
    "gsm8k": "inputs.tasks.sources:load_gsm8k",
    "humaneval": "inputs.tasks.sources:load_humaneval",
    "mt_bench": "inputs.tasks.sources:load_mt_bench",
    "jsonl": "inputs.tasks.sources:load_jsonl",
}

GSM8K_FILES = {"test": "gsm8k/test.jsonl", "train": "gsm8k/train.jsonl"}
HUMANEVAL_FILE = "humaneval/HumanEval.jsonl.gz"
MT_BENCH_FILE = "mt_bench/question.jsonl"
MT_BENCH_REFERENCE_FILE = "mt_bench/reference_answer/gpt-4.jsonl"

GSM8K_HUB = ("openai/gsm8k", "main")
HUMANEVAL_HUB = ("openai/openai_humaneval", None)
# Same schema as FastChat's question.jsonl (question_id/category/turns/reference), so ids and content
# hashes match a local copy. HuggingFaceH4/mt_bench_prompts (prompt/prompt_id) is also understood.
MT_BENCH_HUB = ("lighteval/mt-bench", None)


class DataNotFoundError(FileNotFoundError):
    """Neither the data directory nor the hub could provide a dataset."""


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """`data_dir` if given, else $HARNESS_DATA_DIR, else None."""
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV) or None
    return None if data_dir is None else Path(data_dir).expanduser()


# --- built-in loaders ---------------------------------------------------------------------------------

def load_gsm8k(split: str = "test", *, data_dir: str | os.PathLike[str] | None = None,
               hub: bool = True) -> list[TaskSample]:
    """GSM8K (test: 1,319 problems). Sample ids are "<split>/<line index>"; the reference is the final
    answer after "####"; metadata["solution"] is the full worked solution."""
    rows = _rows(f"gsm8k ({split})", [_gsm8k_file(split)], data_dir, hub,
                 read_local=lambda root: _read_jsonl(root / _gsm8k_file(split)),
                 hub_args=(*GSM8K_HUB, split))
    return [TaskSample(id=f"{split}/{i}", turns=(row["question"],), references=(gsm8k_final_answer(row["answer"]),),
                       metadata={"solution": row["answer"]})
            for i, row in enumerate(rows)]


def gsm8k_train_pairs(data_dir: str | os.PathLike[str] | None = None, *, hub: bool = True) -> list[tuple[str, str]]:
    """GSM8K train as (question, full solution) pairs, in file order: material for training a tiny model."""
    return [(s.turns[0], s.metadata["solution"]) for s in load_gsm8k("train", data_dir=data_dir, hub=hub)]


def gsm8k_final_answer(solution: str) -> str:
    """The text after the last "####" in a GSM8K solution, with thousands separators removed."""
    return solution.rsplit("####", 1)[-1].strip().replace(",", "")


def load_humaneval(split: str = "test", *, data_dir: str | os.PathLike[str] | None = None,
                   hub: bool = True) -> list[TaskSample]:
    """HumanEval (164 problems, split "test" only). The turn is the function prompt; the reference is
    the canonical solution; metadata carries entry_point and test for a later pass@1 scorer."""
    _only_split("humaneval", split, "test")
    rows = _rows("humaneval", [HUMANEVAL_FILE], data_dir, hub,
                 read_local=lambda root: _read_jsonl(root / HUMANEVAL_FILE),
                 hub_args=(*HUMANEVAL_HUB, "test"))
    return [TaskSample(id=row["task_id"], turns=(row["prompt"],), references=(row["canonical_solution"],),
                       metadata={"entry_point": row["entry_point"], "test": row["test"]})
            for row in rows]


def load_mt_bench(split: str = "test", *, data_dir: str | os.PathLike[str] | None = None,
                  hub: bool = True) -> list[TaskSample]:
    """MT-Bench (80 questions, two user turns each). References per turn come from
    reference_answer/gpt-4.jsonl when present, else from the question's own "reference" field."""
    _only_split("mt_bench", split, "test")

    def read_local(root: Path) -> list[dict[str, Any]]:
        rows = _read_jsonl(root / MT_BENCH_FILE)
        ref_path = root / MT_BENCH_REFERENCE_FILE
        if ref_path.is_file():
            refs = {r["question_id"]: r["choices"][0]["turns"] for r in _read_jsonl(ref_path)}
            rows = [{**row, "reference": refs[row["question_id"]]} if row["question_id"] in refs else row
                    for row in rows]
        return rows

    rows = _rows("mt_bench", [MT_BENCH_FILE], data_dir, hub, read_local=read_local,
                 hub_args=(*MT_BENCH_HUB, "train"), optional_files=[MT_BENCH_REFERENCE_FILE])
    samples = []
    for i, row in enumerate(rows):
        turns = row.get("turns") or row.get("prompt")  # FastChat / HuggingFaceH4 spelling
        if not turns:
            raise ValueError(f"mt_bench row {i}: no 'turns' (or 'prompt') field (fields: {', '.join(row)})")
        qid = row.get("question_id", row.get("prompt_id", i))
        samples.append(TaskSample(id=str(qid), turns=tuple(turns), references=tuple(row.get("reference") or ()),
                                  metadata={"category": row.get("category", "")}))
    return samples


def load_jsonl(split: str = "test", *, data_dir: str | os.PathLike[str] | None = None, hub: bool = True,
               data_file: str, input_field: str = "question", reference_field: str | None = None,
               id_field: str | None = None) -> list[TaskSample]:
    """A local jsonl file of your own (`data_file`, relative to the data directory or absolute), so that a
    new task needs only a YAML file. `input_field` holds a string or a list of user turns;
    `reference_field` (optional) a string or a list; ids are `id_field` or the line index. Local only."""
    del hub  # a private file has no hub copy
    path = Path(data_file).expanduser()
    if not path.is_absolute():
        root = resolve_data_dir(data_dir)
        if root is None or not (root / path).is_file():
            raise DataNotFoundError(_missing_message(f"jsonl task data ({split})", root, [data_file], [], None))
        path = root / path
    elif not path.is_file():
        raise DataNotFoundError(f"task data file {path} does not exist")
    samples = []
    for i, row in enumerate(_read_jsonl(path)):
        where = f"{path}:{i + 1}"
        if input_field not in row:
            raise ValueError(f"{where}: no field {input_field!r} (fields: {', '.join(row)})")
        turns = row[input_field]
        refs = row.get(reference_field) if reference_field else None
        samples.append(TaskSample(
            id=str(row[id_field]) if id_field else str(i),
            turns=(turns,) if isinstance(turns, str) else tuple(turns),
            references=() if refs is None else (refs,) if isinstance(refs, str) else tuple(refs),
        ))
    return samples


# --- local first, then hub, then a helpful error -------------------------------------------------------

def _rows(what: str, files: list[str], data_dir: str | os.PathLike[str] | None, hub: bool,
          read_local: Callable[[Path], list[dict[str, Any]]], hub_args: tuple[str, str | None, str],
          optional_files: Iterable[str] = ()) -> list[dict[str, Any]]:
    root = resolve_data_dir(data_dir)
    if root is not None and all((root / f).is_file() for f in files):
        log.debug("loading %s from %s", what, root)
        return read_local(root)
    hub_error: Exception | None = None
    if not hub:
        hub_failure = "not tried (hub=False)"
    else:
        try:
            return _hub_rows(*hub_args)
        except ImportError as e:
            hub_error, hub_failure = e, "the `datasets` package is not installed (pip install datasets)"
        except Exception as e:  # noqa: BLE001 - any hub failure (offline, missing, auth) becomes our error
            hub_error, hub_failure = e, f"{type(e).__name__}: {e}"
    raise DataNotFoundError(_missing_message(what, root, files, list(optional_files),
                                             (hub_args, hub_failure))) from hub_error


def _hub_rows(path: str, name: str | None, split: str) -> list[dict[str, Any]]:
    import datasets  # optional dependency, imported only when the local copy is missing

    log.info("loading %s%s [%s] from the Hugging Face hub", path, f" ({name})" if name else "", split)
    return [dict(row) for row in datasets.load_dataset(path, name, split=split)]


def _missing_message(what: str, root: Path | None, files: list[str], optional_files: list[str],
                     hub: tuple[tuple[str, str | None, str], str] | None) -> str:
    lines = [f"cannot load {what}."]
    if root is None:
        lines.append(f"  data directory: not set (set {DATA_DIR_ENV} or pass data_dir=)")
    else:
        missing = [f for f in files if not (root / f).is_file()]
        lines.append(f"  data directory {root}: missing {', '.join(missing)}")
    if hub is not None:
        (path, name, split), failure = hub
        lines.append(f"  Hugging Face hub {path}{f' ({name})' if name else ''} [{split}]: {failure}")
    lines.append(f"Fix: put these files (original formats) under a directory and set {DATA_DIR_ENV} to it"
                 " (or pass data_dir=):")
    lines += [f"  <{DATA_DIR_ENV}>/{f}" for f in files]
    lines += [f"  <{DATA_DIR_ENV}>/{f}   (optional)" for f in optional_files]
    return "\n".join(lines)


def _gsm8k_file(split: str) -> str:
    if split not in GSM8K_FILES:
        raise ValueError(f"gsm8k has splits {', '.join(GSM8K_FILES)}, not {split!r}")
    return GSM8K_FILES[split]


def _only_split(dataset: str, split: str, valid: str) -> None:
    if split != valid:
        raise ValueError(f"{dataset} has only the {valid!r} split, not {split!r}")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    return rows
