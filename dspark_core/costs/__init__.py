"""What steps cost on a given machine: the tables the schedulers plan with, and the files that keep them.

| module          | holds                                                                              |
|-----------------|------------------------------------------------------------------------------------|
| `fingerprint`   | `SPSFingerprint` (device, dtype, target, context length) and the JSON checks shared |
| `sps`           | `SPSTable`: verify steps per second against tokens verified, SPS(B) (Algorithm 1)  |
| `step_costs`    | `StepCostTable`: draft + verify seconds of an engine step (the cost-aware scheduler) |
| `table_files`   | the JSON files holding both kinds, keyed by fingerprint                            |

Measuring them is the engine's job (`backends/inhouse/profile.py`); nothing here runs a model.
"""

from dspark_core.costs.fingerprint import SPSFingerprint, device_name, fingerprint_for
from dspark_core.costs.sps import SPSTable, read_sps_csv, step_sps_table
from dspark_core.costs.step_costs import StepCostTable
from dspark_core.costs.table_files import (
    SPS_FORMAT, SPS_FORMAT_VERSION, load_sps_table, load_sps_tables, load_step_cost_table, load_step_cost_tables,
    save_sps_table,
)

__all__ = [
    "SPSFingerprint", "SPSTable", "SPS_FORMAT", "SPS_FORMAT_VERSION", "StepCostTable", "device_name",
    "fingerprint_for", "load_sps_table", "load_sps_tables", "load_step_cost_table", "load_step_cost_tables",
    "read_sps_csv", "save_sps_table", "step_sps_table",
]
