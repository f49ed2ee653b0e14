"""A draft model cut from the embedded target: its first N decoder layers with its embeddings, final norm,
LM head and tokenizer, saved as an ordinary Hugging Face causal LM.

Why: a `draft_model` drafter (a separate small LM with the target's vocabulary) that agrees with the
target often but not always, built in seconds from what is committed, so CI can compare our
`DraftModelDrafter` with vLLM's `draft_model` method on real acceptance (the target as its own draft
accepts everything and compares nothing). No training, no download; the same files on every machine
for the same target, so the cell's draft fingerprint is stable.

    python -m recipes.embedded.truncated OUT_DIR [--layers 2]     # idempotent: an existing OUT_DIR is kept
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path


def truncate_target(out_dir: str | Path, num_layers: int = 2, target: str = "embedded") -> Path:
    """Save `target`'s first `num_layers` decoder layers as a causal LM in `out_dir` (kept if it exists)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inputs import model_refs

    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    location = model_refs.resolve(target).location
    model = AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32)
    config = copy.deepcopy(model.config)
    if not 1 <= num_layers < config.num_hidden_layers:
        raise ValueError(f"--layers must be in 1 … {config.num_hidden_layers - 1}, got {num_layers}")
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    draft = type(model)(config).eval()
    missing, _ = draft.load_state_dict(model.state_dict(), strict=False)  # the cut layers are unexpected keys
    if missing:
        raise RuntimeError(f"the cut model lacks weights the target should have: {missing}")
    draft.save_pretrained(out)
    AutoTokenizer.from_pretrained(location).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.embedded.truncated", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--target", default="embedded")
    args = parser.parse_args(argv)
    print(truncate_target(args.out_dir, args.layers, args.target))


if __name__ == "__main__":
    main()
