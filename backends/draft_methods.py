"""Which speculative method an engine must run a draft checkpoint as: what the checkpoint's config says it is,
not what the suite calls the drafter.

DeepSpec writes its DSpark and its DFlash drafts alike as `Qwen3DSparkModel` (markov_rank 256 for DSpark, 0
for DFlash: a DFlash draft is a DSpark draft without the Markov head). vLLM's `dflash` method fails to load
that class (vLLM issue 49614) and its `dspark` method runs both, so a `dflash` drafter whose checkpoint is a
`Qwen3DSparkModel` runs as `dspark`; z-lab's DFlash drafts are `DFlashDraftModel` and run as `dflash`.
The architecture is read from the checkpoint's config.json: a local directory's, else the Hugging Face cache's
copy of a hub id (offline, nothing downloaded), else the table of released drafts below.
"""

from __future__ import annotations

import json
from pathlib import Path

from inputs import model_refs

ARCHITECTURE_METHODS = {"Qwen3DSparkModel": "dspark", "Qwen3OmniDSparkModel": "dspark", "DFlashDraftModel": "dflash"}

# Released drafts and the architecture their config.json declares, for when the hub id is not downloaded here
# (DeepSpec README: Qwen3-4B/8B/14B, block 7, 5 draft layers, mask token 151669).
RELEASED_ARCHITECTURES = {
    **{f"deepseek-ai/{kind}_qwen3_{size}_block7": "Qwen3DSparkModel"
       for kind in ("dspark", "dflash") for size in ("4b", "8b", "14b")},
    "z-lab/Qwen3-8B-DFlash-b16": "DFlashDraftModel",
    "z-lab/Qwen3-4B-DFlash-b16": "DFlashDraftModel",
}


def architecture(checkpoint: str) -> str | None:
    """The first architecture the checkpoint's config.json names that an engine routes on, else None."""
    config = config_file(checkpoint)
    if config is not None:
        try:
            names = json.loads(config.read_text()).get("architectures") or []
        except (OSError, ValueError):
            names = []
        for name in names:
            if name in ARCHITECTURE_METHODS:
                return name
        return None
    return RELEASED_ARCHITECTURES.get(checkpoint)


def config_file(checkpoint: str) -> Path | None:
    """The checkpoint's config.json on this machine: in its directory, or in the Hugging Face cache."""
    ref = model_refs.resolve(checkpoint)
    if ref.is_local:
        path = ref.path / "config.json"
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(ref.location, "config.json")
    return Path(found) if isinstance(found, str) else None


def method_for(checkpoint: str | None, declared: str) -> str:
    """The method a draft runs as: its architecture's (module docstring), else the suite's `declared` one."""
    if declared not in ("dspark", "dflash") or not checkpoint:
        return declared
    return ARCHITECTURE_METHODS.get(architecture(checkpoint) or "", declared)


def present_here(checkpoint: str) -> bool:
    """Whether the model's files are on this machine (a local directory, or a hub id in the cache)."""
    return config_file(checkpoint) is not None
