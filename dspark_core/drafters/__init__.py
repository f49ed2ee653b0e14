"""The drafter family behind one interface, and how to build each from a name.

| name        | what proposes                                                 | trained | confidence |
|-------------|---------------------------------------------------------------|---------|------------|
| dspark      | parallel block backbone + Markov/gated/RNN head               | yes     | yes        |
| dflash      | the same backbone, no heads                                   | yes     | no         |
| eagle3      | shallow autoregressive decoder over fused target features     | yes     | no         |
| draft_model | a separate, smaller causal LM sharing the target's vocabulary | any LM  | no         |
| ngram       | prompt lookup                                                 | no      | no         |
| none        | nothing (plain decoding)                                      | no      | no         |

`dspark`, `dflash` and `eagle3` checkpoints are drafts in our format (`dspark_core.checkpoint`);
a `draft_model` checkpoint is an ordinary Hugging Face causal LM (a local directory or a hub id).
"""

from __future__ import annotations

from dspark_core.drafters.base import DraftProposal, DraftStep, Drafter, NoDrafter
from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.draft_model import DraftModelDrafter, VocabularyMismatch, load_draft_model
from dspark_core.drafters.dspark import DSparkDrafter, DSparkModel
from dspark_core.drafters.eagle3 import Eagle3Drafter, Eagle3Model
from dspark_core.drafters.factory import DRAFTERS, build_drafter, draft_config_for
from dspark_core.drafters.models import as_drafter, build_draft_model
from dspark_core.drafters.ngram import NgramDrafter

__all__ = [
    "DRAFTERS", "DSparkDrafter", "DSparkModel", "DraftConfig", "DraftModelDrafter", "DraftProposal", "DraftStep",
    "Drafter", "Eagle3Drafter", "Eagle3Model", "NgramDrafter", "NoDrafter", "VocabularyMismatch", "as_drafter",
    "build_draft_model", "build_drafter", "draft_config_for", "load_draft_model",
]
