"""The names a suite may use, defined once: the schema validates against these, the backends dispatch on them.

Before, the schema kept its own copies of lists the backends also spelled out (methods, policies, dtypes),
and a name added on one side was refused or ignored on the other. Backend names are the keys of the
registry (`contracts.backend.BACKENDS`).
"""

from __future__ import annotations

METHODS = ("none", "dspark", "dflash", "eagle3", "ngram", "draft_model")  # drafter methods; none: plain decoding
WEIGHTED_METHODS = ("dspark", "dflash", "eagle3", "draft_model")  # need a checkpoint
LM_METHODS = ("draft_model",)  # the checkpoint is a Hugging Face causal LM ('embedded': the embedded target)
CONFIDENCE_METHODS = ("dspark",)  # proposals carry confidence logits (dspark_core DraftConfig: only dspark has the head)
HEADS = ("markov", "gated", "rnn")  # dspark confidence heads
POLICIES = ("full", "static", "threshold", "scheduler", "budget", "adaptive")  # verification policies
TABLE_POLICIES = ("scheduler", "budget", "adaptive")  # priced by a measured table (SPS(B); adaptive: step costs)
CONFIDENCE_POLICIES = ("threshold", "scheduler", "budget")  # read the drafter's confidences
DTYPES = ("float32", "bfloat16", "float16")  # target dtypes (torch's names)
# A suite may also write `auto`: bfloat16 where the machine expanding the suite has native bf16 matmuls, else
# float32 (dspark_core.native_dtype.fast_dtype); a cell always carries the dtype it resolved to.
SUITE_DTYPES = DTYPES + ("auto",)
