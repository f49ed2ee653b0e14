"""What a suite's `gates:` and `validity:` sections say: the contract between the suite loader and the gate."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GateRule:
    """One gated metric (a name of harness.metrics, e.g. acceptance_length, ece_calibrated, throughput).

    A regression needs both: statistical significance at `alpha` under `test`, and an effect beyond the
    threshold (`relative`, a fraction of the baseline, and/or `absolute`, in the metric's unit) and
    beyond `min_effect` (relative). Fewer than `min_samples` paired units (prompts for the bootstrap,
    repeats for Mann-Whitney) makes the comparison inconclusive, which is reported, never a pass.
    """

    metric: str
    direction: str  # higher (bigger is better) | lower
    test: str = "paired_bootstrap"  # paired_bootstrap (over prompts) | mann_whitney (over repeats) |
    #                                 paired_rounds (ranks of per-round paired ratios) | threshold (no test)
    relative: float | None = 0.02  # allowed relative worsening
    absolute: float | None = None  # allowed absolute worsening
    min_effect: float = 0.0  # smallest relative effect worth failing on
    min_samples: int = 8
    alpha: float = 0.05
    level: str = "fail"  # fail | warn
    resamples: int = 2000  # bootstrap resamples


@dataclass(frozen=True)
class Validity:
    """A run is judged only if it is valid: enough requests and time measured, few enough failures."""

    min_requests: int = 1  # succeeded requests in the window, per cell
    min_duration_s: float = 0.0  # measurement window, per cell
    max_failed_fraction: float = 0.0  # failed cells / cells, and failed requests / requests per cell


# Metrics whose gate compares per-round paired ratios (speedup over plain decoding of the same round).
ROUND_RATIO_METRICS = ("speedup", "throughput_speedup")


def rounds_needed(rule: GateRule) -> int | None:
    """The rounds (repeats) a run needs before `rule` can fire, None when it does not count rounds
    (prompt-level bootstrap, threshold). A suite with fewer is refused at load (harness.runner)."""
    from harness.gate.evaluate import ECE_METRICS, PROMPT_RATIOS
    from harness.gate.stats import mann_whitney_rounds_needed

    test = rule.test
    if test == "threshold" or (test == "paired_bootstrap" and (rule.metric in PROMPT_RATIOS or rule.metric in ECE_METRICS)):
        return None
    # paired_rounds ranks the per-round ratios (Mann-Whitney), as mann_whitney ranks repeats: same minimum
    return max(mann_whitney_rounds_needed(rule.alpha), rule.min_samples)
