"""Production-shape causal LMs with random weights: engine speed at real shapes, nothing downloaded.

Why: synthetic acceptance (`verification.synthetic_verifier`) separates engine speed from drafter
quality, but on the small committed targets it says little about an 8B model's step costs, and the real
checkpoints are hub downloads. No step cost depends on the weights' values (the same kernels run
whatever token wins), so a model built from the real config with random weights costs what the trained
one does. Its outputs mean nothing, so such a model is never evidence of losslessness or quality: every
row it touches says so (the harness's `random:<shape>` target ref, its label and provenance).

A random model is a directory like any Hugging Face checkpoint — `config.json`, a tokenizer — plus the
marker `random_init.json` ({"shape", "seed"}) in place of weights; `load_causal_lm` builds it from the
config with `seed` (on the device, in the dtype: seconds for 8B on a GPU, no 16 GB on disk) and loads
any other directory with `from_pretrained`. SHAPES hold the published configs' sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

MARKER = "random_init.json"

_QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151_936, rms_norm_eps=1e-6,
              rope_theta=1_000_000.0, max_position_embeddings=40_960, head_dim=128, hidden_act="silu")
_LLAMA3 = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128_256, rms_norm_eps=1e-5,
               rope_theta=500_000.0, max_position_embeddings=131_072, head_dim=128, hidden_act="silu",
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192})
_TINY = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, tie_word_embeddings=False)

# name → Hugging Face config fields (the published models' shapes; tiny-*: the same architectures, CPU tests)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12_288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
    "qwen3-0.6b": {**_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "llama-3.1-8b": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14_336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
    "tiny-qwen3": {**_QWEN3, **_TINY},
    "tiny-llama": {**_LLAMA3, **_TINY, "rope_scaling": None, "rope_theta": 10_000.0},
}


def write_random_dir(directory: str | Path, shape: str, seed: int = 0) -> Path:
    """Write `config.json` of `shape` and the marker into `directory` (tokenizer files are the caller's)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown random model shape {shape!r}; valid: {', '.join(SHAPES)}")
    from transformers import AutoConfig

    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    (directory / MARKER).write_text(json.dumps({"shape": shape, "seed": seed,
                                                "note": "random weights: engine speed only, outputs meaningless"},
                                               sort_keys=True) + "\n", encoding="utf-8")
    return directory


def random_init(location: str | Path) -> dict | None:
    """The marker of a random-weight directory ({"shape", "seed", …}), None for anything else."""
    marker = Path(str(location)) / MARKER
    return json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else None


def load_causal_lm(location: str | Path, dtype: torch.dtype, device: str | torch.device = "cpu"):
    """A Hugging Face causal LM: built with seeded random weights where `location` is a random-weight
    directory (module docstring), else `from_pretrained` (a local directory or a hub id)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    marker = random_init(location)
    if marker is None:
        return AutoModelForCausalLM.from_pretrained(str(location), dtype=dtype).to(device)  # type: ignore[arg-type]  # transformers types .to as its decorator
    config = AutoConfig.from_pretrained(str(location))
    state = torch.random.get_rng_state()
    torch.manual_seed(int(marker.get("seed", 0)))
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    finally:
        torch.random.set_rng_state(state)
    return model
