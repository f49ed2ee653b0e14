"""The `harness` command. Thin: one small function per verb over plain functions that tests call.

Verbs so far: `harness embedded build DIR` (rebuild the embedded default) and `harness embedded
evaluate` (measure it). `run`, `gate`, `query` and friends arrive with the suite runner.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: harness embedded {build,evaluate} [options]   (harness embedded build -h for help)"
    if len(argv) < 2 or argv[0] != "embedded" or argv[1] not in ("build", "evaluate"):
        print(usage, file=sys.stderr)
        return 2
    if argv[1] == "build":
        from harness.embedded.build import main as build_main

        return build_main(argv[2:])
    from harness.embedded.evaluate import main as evaluate_main

    return evaluate_main(argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
