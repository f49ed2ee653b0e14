"""`check_paths`: before any cell runs, every local model directory and SPS table the cells use exists.

Model strings are resolved by `inputs.model_refs`, the one resolver the backends also load with, so
the check and the run agree: `embedded` is the embedded default's target, `embedded:<name>` one of its
drafts (models/embedded/drafts/<name>, or under $HARNESS_EMBEDDED_DIR), a path is a local directory, and
an `org/name` that is not on disk is a hub id, which is not checked here (it is fetched when it loads).
Relative paths (models and SPS tables) are taken from the working directory, as the backends take them.
Cells keep the string as written, so a cell's id never depends on the machine it runs on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from inputs import model_refs
from contracts.cells import Cell
from harness.suite.document import DocPath
from harness.suite.errors import did_you_mean
from harness.suite.expand import expand
from harness.suite.load import Suite


def check_paths(suite: Suite, cells: Iterable[Cell] | None = None) -> None:
    """Raise a SuiteError, at the suite line that names it, for the first model directory or SPS table
    that `cells` (default: all of the suite's) use and that is not on disk. Definitions no cell uses are
    not checked, so `--only` runs need only what they run."""
    cells = expand(suite) if cells is None else list(cells)
    for name in dict.fromkeys(c.target.name for c in cells):
        _check_model(suite, ("targets", name, "path"), suite.targets[name].path)
    for name in dict.fromkeys(c.drafter.name for c in cells if c.drafter.checkpoint):
        _check_model(suite, ("drafters", name, "checkpoint"), suite.drafters[name].checkpoint or "")
    used = {(c.policy.name, c.policy.sps_table) for c in cells if c.policy.sps_table}
    for key, policy in suite.policies.items():
        if policy.sps_table and (policy.name, policy.sps_table) in used and not Path(policy.sps_table).is_file():
            raise suite.locations.error(("policies", key, "sps_table"),
                                        f"SPS table {Path(policy.sps_table).resolve()} does not exist")


def _check_model(suite: Suite, where: DocPath, text: str) -> None:
    try:
        ref = model_refs.resolve(text)
    except model_refs.UnavailableModel as exc:  # a packaged target whose package is not installed
        raise suite.locations.error(where, str(exc)) from None
    missing = model_refs.missing_files(ref, ())
    if not missing:
        return
    message = f"{text} resolves to {missing[0]}, which does not exist"
    if text.startswith(model_refs.EMBEDDED + ":"):
        drafts = model_refs.embedded_root() / "drafts"
        available = sorted(p.name for p in drafts.iterdir() if p.is_dir()) if drafts.is_dir() else []
        message += (f"{did_you_mean(text.partition(':')[2], available)}; embedded drafts: "
                    f"{', '.join(available) or 'none'}")
    elif text.startswith(model_refs.SMOLLM2 + ":"):
        out = model_refs.real_drafts_root(model_refs.SMOLLM2).parent
        message += (f" (its drafts are built by this project: python3 -m recipes.real.build {out}, about 90 min on "
                    f"2 cores; --resume finishes an interrupted build)")
    elif text == model_refs.EMBEDDED:
        message += f" (set ${model_refs.EMBEDDED_DIR_ENV}, or rebuild with python3 -m recipes.embedded.build)"
    raise suite.locations.error(where, message)
