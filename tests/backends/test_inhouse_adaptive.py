"""The `adaptive` suite policy on the in-house backend: `CostAwareScheduler` over a step-cost table profiled on
this machine (or read from the suite's file), lossless, for any drafter (it plans from realised acceptance, so
n-gram works too), and refused by the servers that cannot run it."""

from __future__ import annotations

import pytest

from contracts.backend import BackendError
from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec

DSPARK = DrafterSpec("dspark", "dspark", "embedded:dspark")
NGRAM = DrafterSpec("ngram", "ngram")


def _cell(drafter: DrafterSpec, policy: PolicySpec, gamma: int = 3, concurrency: int = 2) -> Cell:
    return Cell("inhouse", TargetSpec("embedded", "embedded"), drafter, gamma if drafter.method != "none" else 0,
                TaskSpec("gsm8k", 4, 24, 0.0), policy, concurrency=concurrency)


def _outputs(result) -> dict[str, tuple[int, ...]]:
    return {r.prompt_key: r.output_ids for r in result.requests}


@pytest.fixture(scope="module")
def backend():
    from backends.inhouse.adapter import InhouseBackend

    b = InhouseBackend(num_threads=1)
    yield b
    b.close()


def test_adaptive_cells_equal_plain_decoding_and_say_where_their_costs_came_from(backend, data_env, tmp_path):
    plain = backend.run_cell(_cell(DrafterSpec("none", "none"), PolicySpec("full")))
    adaptive = backend.run_cell(_cell(DSPARK, PolicySpec("adaptive")))
    assert _outputs(adaptive) == _outputs(plain)
    assert not adaptive.metrics and not adaptive.calibration_bins  # raw records only: the executor derives
    assert adaptive.steps and all(s.draft_length in range(adaptive.requests[0].record.num_drafts + 1)
                                  for s in adaptive.steps)
    assert "step costs profiled 1:" in adaptive.log and " 2:" in adaptive.log  # batch sizes 1, 2 (concurrency 2)
    steps = sum(len(r.record.num_verified) for r in adaptive.requests)
    assert steps > 0
    ngram = backend.run_cell(_cell(NGRAM, PolicySpec("adaptive")))
    assert _outputs(ngram) == _outputs(plain)

    # The table can come from a file instead: the one profiled above, saved in the SPS store format.
    from dspark_core import costs as sps_tables

    target = backend.models.target(_cell(DSPARK, PolicySpec("adaptive")).target)
    table = next(t for k, t in target.tables.items() if isinstance(k, tuple) and k[0] == "step_costs" and k[1] == "dspark")
    path = tmp_path / "costs.json"
    sps_tables.save_sps_table(path, table)
    from_file = backend.run_cell(_cell(DSPARK, PolicySpec("adaptive", sps_table=str(path))))
    assert _outputs(from_file) == _outputs(plain)
    assert f"step costs {path}" in from_file.log


def test_servers_refuse_the_adaptive_policy():
    from backends.sglang.server import server_argv as sglang_argv
    from backends.vllm.server import speculative_config

    with pytest.raises(BackendError, match="no 'adaptive'"):
        speculative_config(_cell(DSPARK, PolicySpec("adaptive")))
    with pytest.raises(BackendError, match="policy 'adaptive'"):
        sglang_argv(_cell(DSPARK, PolicySpec("adaptive")))
