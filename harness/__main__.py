"""`python3 -m harness …` is the `harness` command (for environments where the console script is not on PATH)."""

from harness.cli import main

raise SystemExit(main())
