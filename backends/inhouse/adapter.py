"""The in-house backend: the `contracts.backend.Backend` protocol over `backends.inhouse.engine` and `dspark_core`.

Only the protocol lives here; the work is in public functions beside it, one concern each: `build` (load and
keep targets and drafters, the policy via `policy`, the engine), `run` (a cell's load on the engine, raw
records), `profile` (the tables the policies price by). Our OpenAI server builds its engine through the same
`build` functions, so nothing here is reached from outside but the protocol and `score_tokens`.
"""

from __future__ import annotations

from backends.inhouse import run
from backends.inhouse.build import BuiltEngine, Models, check_specs, device_for, serving_engine
from contracts.backend import BackendError, Progress
from contracts.cells import Cell, CellResult, DrafterSpec, PolicySpec, TargetSpec

OPTIONS = ("device", "num_slots", "max_context", "num_threads")


class InhouseBackend:
    name = "inhouse"

    def __init__(self, device: str | None = None, num_slots: int = 64, max_context: int = 2048, num_threads: int | None = None,
                 **unknown):
        """Options come from the suite's `backend_options.inhouse`."""
        if unknown:
            raise BackendError(f"unknown in-house backend option(s) {', '.join(sorted(unknown))}; "
                               f"valid: {', '.join(OPTIONS)}")
        self.device = device_for(device, num_threads)
        self.num_slots = num_slots
        self.max_context = max_context
        self.models = Models(self.device)

    def check(self, cell: Cell) -> None:
        check_specs(cell.target, cell.drafter, cell.policy, cell.task.temperature)

    def server_command(self, cell: Cell) -> list[str] | None:
        return None

    def close(self) -> None:
        self.models.close()

    def run_cell(self, cell: Cell, progress: Progress | None = None) -> CellResult:
        built = self.models.build(cell.target, cell.drafter, cell.num_drafts, cell.policy,
                                  temperature=cell.task.temperature, rows=cell.concurrency or self.num_slots)
        return run.run_cell(cell, built, num_slots=self.num_slots, max_context=self.max_context, device=self.device,
                            progress=progress)

    def score_tokens(self, cell: Cell, prompt_ids, output_ids, temperature: float):
        """[len(output_ids), vocab] the cell target's next-token distribution before each output token (the
        audit's reference); `run.score_tokens`."""
        return run.score_tokens(self.models.target(cell.target), prompt_ids, output_ids, temperature)

    def build_engine(self, target: TargetSpec, drafter: DrafterSpec, num_drafts: int, policy: PolicySpec, *,
                     temperature: float = 0.0, num_slots: int | None = None,
                     max_context: int | None = None) -> BuiltEngine:
        """`build.serving_engine` on this backend's models and options."""
        return serving_engine(self.models, target, drafter, num_drafts, policy, temperature=temperature,
                              num_slots=num_slots or self.num_slots, max_context=max_context or self.max_context)
