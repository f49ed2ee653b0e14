"""N-gram prompt lookup by vLLM's rule, so that in-house and vLLM n-gram acceptance mean the same thing.

The rule (vLLM's `ngram` method, V1 model runner: `vllm/v1/spec_decode/ngram_proposer.py`, v0.32):
- the sequence searched is every committed token of the request, prompt and output, the anchor (last
  committed token) included; the n-gram is its suffix of length n;
- the longest n in [min_n, max_n] whose suffix occurs earlier wins, whatever the shorter ones would give;
- among the occurrences of that n-gram, the *earliest* wins; an occurrence counts only if at least one
  token follows it (the suffix itself, and a window ending at the anchor, never match; overlapping the
  suffix is allowed);
- the proposal is the tokens after the occurrence, up to `num_drafts` of them, fewer when the sequence
  ends sooner (never padded); with `max_model_len`, at most max_model_len − length tokens, and none once
  the sequence has reached it;
- no occurrence (or a sequence shorter than min_n): no proposal, the step verifies nothing.

Defaults min_n = 2, max_n = 4 are `prompt_lookup_min`/`prompt_lookup_max` as the harness starts vLLM
(`backends/vllm/server.NGRAM`); vLLM's own default when neither is given is 5/5.

Where the other engines differ (read in their sources, not tested here):
- vLLM's V2 model runner (`vllm/v1/worker/gpu/spec_decode/ngram/speculator.py`, the default where Triton
  runs, i.e. on GPU) takes the *latest* occurrence of the longest n-gram and always proposes γ tokens,
  padding past the end of the sequence with the last sampled token (verified, so rejected, as drafts):
  its counts differ from these whenever two occurrences disagree or a match is near the end.
- SGLang's NGRAM (`python/sglang/srt/speculative/cpp_ngram/`, CUDA only) looks up a trie shared by all
  requests (prompts and outputs inserted, LRU-evicted, windows up to `branch_length`), matches suffix
  windows from 12 down to 1 tokens by default (`--speculative-ngram-{min,max}-match-window-size`), and
  proposes a *tree* of `--speculative-num-draft-tokens` tokens, most recent continuations first (BFS) or
  most frequent (PROB), verified as a tree: not a chain of one occurrence, and it depends on other requests.

Drafts are deterministic, so their draft distribution is one-hot (`draft_probs=None`) and verification
stays exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark_core.drafters.base import DraftProposal, DraftStep, StatelessDrafter


class NgramDrafter(StatelessDrafter):
    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4, max_model_len: int | None = None):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        if max_model_len is not None and max_model_len < 1:
            raise ValueError(f"max_model_len must be positive, got {max_model_len}")
        self.min_n, self.max_n, self.max_model_len = min_n, max_n, max_model_len

    def propose(self, state: None, step: DraftStep) -> DraftProposal:
        n = step.num_drafts
        tokens = torch.zeros(len(step.rows), n, dtype=torch.long)
        num_valid = torch.zeros(len(step.rows), dtype=torch.long)
        history = step.token_ids.cpu()
        for j, (row, length) in enumerate(zip(step.rows.tolist(), step.num_tokens[step.rows].tolist())):
            found = self.lookup(history[row, :length], n)
            tokens[j, : len(found)] = found
            num_valid[j] = len(found)
        device = step.token_ids.device
        return DraftProposal(tokens.to(device), None, None, num_valid.to(device))

    def lookup(self, seq: Tensor | list[int], num_drafts: int) -> Tensor:
        """The proposal for one request's committed tokens `seq` [length] (module docstring): a long
        tensor of at most `num_drafts` tokens, empty when nothing matches."""
        seq = torch.as_tensor(seq, dtype=torch.long)
        length = seq.shape[0]
        if self.max_model_len is not None:
            num_drafts = min(num_drafts, self.max_model_len - length)
        if num_drafts <= 0:
            return seq[:0]
        for size in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            # windows starting at 0 … length − size − 1: each is followed by at least one token
            windows = seq[: length - 1].unfold(0, size, 1)  # [length − size, size]
            hits = (windows == seq[length - size :]).all(dim=1).nonzero()
            if len(hits):
                start = int(hits[0]) + size  # the earliest occurrence
                return seq[start : start + num_drafts]
        return seq[:0]
