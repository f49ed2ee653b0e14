"""How a run stops early, shared by the runner and the executors (which raise them from inside a run).

Here rather than in `harness.runner` so that the executors, which the runner drives, need not import it back.
"""


class RunError(Exception):
    """Bad input or an unusable store: one actionable line, exit 2, nothing written."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; the cell in flight is dropped, every finished one is kept.

    A BaseException, as KeyboardInterrupt is: the signal handler raises it wherever the main thread is,
    often inside a backend's broad `except Exception` (which must record a cell's failure and go on, and
    cannot import harness to know better). Were it an Exception, a SIGTERM during a server cell became
    that cell's failure and the run went on (measured: `timeout` stopping a vLLM suite)."""
