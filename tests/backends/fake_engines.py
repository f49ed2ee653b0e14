"""Stand-in vLLM / SGLang installs for server-backend tests: `sglang/fake_engine_server.py` placed where
`python -m vllm.entrypoints.openai.api_server` / `python -m sglang.launch_server` finds it, optionally with
the `_version.py` a real install has, so the adapters' version probe reads a version of the test's choosing."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

FAKE = Path(__file__).resolve().parent / "sglang" / "fake_engine_server.py"
MODULES = {"vllm": "entrypoints/openai/api_server.py", "sglang": "launch_server.py"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install(root: Path, engine: str, version: str | None = None) -> dict:
    """Backend options that launch the stand-in for `engine` from `root` (reporting `version` if given)."""
    target = root / engine / MODULES[engine]
    target.parent.mkdir(parents=True, exist_ok=True)
    directory = target.parent
    while directory != root:
        (directory / "__init__.py").touch()
        directory = directory.parent
    shutil.copy(FAKE, target)
    if version is not None:
        (root / engine / "_version.py").write_text(f"__version__ = {version!r}\n")
    return {"python": sys.executable, "port": free_port(), "env": [f"PYTHONPATH={root}"], "startup_timeout_s": 60}
