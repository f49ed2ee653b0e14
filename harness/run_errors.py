"""How a run stops early, shared by the runner and the executors (which raise them from inside a run).

Here rather than in `harness.runner` so that the executors, which the runner drives, need not import it back.
"""


class RunError(Exception):
    """Bad input or an unusable store: one actionable line, exit 2, nothing written."""


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; the cell in flight is dropped, every finished one is kept."""
