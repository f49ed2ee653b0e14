"""Draft networks from a config, and the drafter that proposes with each: the two steps every loader takes."""

from __future__ import annotations

from torch import nn

from dspark_core.drafters.base import Drafter
from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.dspark import DSparkDrafter, DSparkModel
from dspark_core.drafters.eagle3 import Eagle3Drafter, Eagle3Model


def build_draft_model(config: DraftConfig) -> DSparkModel | Eagle3Model:
    return Eagle3Model(config) if config.method == "eagle3" else DSparkModel(config)


def as_drafter(model: nn.Module) -> Drafter:
    if isinstance(model, Eagle3Model):
        return Eagle3Drafter(model)
    if isinstance(model, DSparkModel):
        return DSparkDrafter(model)
    raise TypeError(f"not a draft model: {type(model).__name__}")
