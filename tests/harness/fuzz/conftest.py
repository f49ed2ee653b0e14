"""The fuzz tables' shared pieces: stores built through the real store API (tests/harness/store's
hand-built cells, no model) and the check every row makes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))  # store_fixtures
