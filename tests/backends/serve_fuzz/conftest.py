"""One in-process `harness serve` (the embedded target, plain decoding, small limits) for the fuzz tables."""

from __future__ import annotations

import pytest

READ_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 3.0
MAX_BODY_BYTES = 256 << 10


@pytest.fixture(scope="session")
def engine_parts():
    from backends.inhouse.adapter import InhouseBackend
    from contracts.cells import DrafterSpec, PolicySpec, TargetSpec

    backend = InhouseBackend(device="cpu", num_slots=4, max_context=128, num_threads=1)
    built = backend.build_engine(TargetSpec("served", "embedded"), DrafterSpec("none", "none"), 0, PolicySpec("full"))
    yield built
    backend.close()


@pytest.fixture(scope="session")
def served(engine_parts):
    from backends.inhouse.server import serve_thread
    from backends.inhouse.serving.app import Limits

    limits = Limits(max_body_bytes=MAX_BODY_BYTES, read_timeout_s=READ_TIMEOUT_S, idle_timeout_s=IDLE_TIMEOUT_S,
                    write_timeout_s=5.0)
    with serve_thread(engine_parts.engine, engine_parts.tokenizer, engine_parts.stop_token_ids,
                      limits=limits) as server:
        yield server
    server.served.loop.stop()
