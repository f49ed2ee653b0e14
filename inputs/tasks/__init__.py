"""Benchmark tasks: what prompts a run feeds the model, and a fingerprint of that data.

    from inputs.tasks import load_task, prompt_ids, render_messages

    task = load_task("gsm8k", n_samples=100, seed=0)        # data dir ($HARNESS_DATA_DIR), then the hub
    task.content_hash                                       # sha256 of the samples + template + version
    for sample in task.samples:
        ids = prompt_ids(tokenizer, task.spec, sample)      # chat template, generation prompt appended

A new task is a YAML file (see `inputs.tasks.spec`) in `inputs/tasks/` or in a directory named by
$HARNESS_TASKS_DIR; its data comes from a built-in dataset, a local jsonl file, or your own
"module:function" loader (see `inputs.tasks.sources`).
"""

from inputs.tasks.prompts import prompt_ids, render_messages, tokenize_messages
from inputs.tasks.registry import (TASKS_DIR_ENV, TaskData, UnknownTaskError, get_task, list_tasks, load_task,
                                    resolve_loader, task_dirs)
from inputs.tasks.selection import content_hash, select_subset
from inputs.tasks.sources import (DATA_DIR_ENV, DATASETS, DataNotFoundError, gsm8k_final_answer, gsm8k_train_pairs,
                                   resolve_data_dir)
from inputs.tasks.spec import TaskConfigError, TaskSample, TaskSpec

__all__ = [
    "DATASETS", "DATA_DIR_ENV", "TASKS_DIR_ENV", "DataNotFoundError", "TaskConfigError", "TaskData", "TaskSample",
    "TaskSpec", "UnknownTaskError", "content_hash", "get_task", "gsm8k_final_answer", "gsm8k_train_pairs",
    "list_tasks", "load_task", "prompt_ids", "render_messages", "resolve_data_dir", "resolve_loader",
    "select_subset", "task_dirs", "tokenize_messages",
]
