"""The embedded default: a tiny target (and, later, its drafts) trained here, so the CPU suite measures real
speculative decoding on any machine with no network.

The target: `tokenizer` (byte-level BPE + ChatML template), `corpus` (math/code/chat examples from GSM8K
and the Python installation) and `target` (the Qwen3 target's presets, training loop and save; entry
point `train_target`, or `python -m recipes.embedded.target OUT_DIR --preset default|reduced`).
Nothing in the harness imports it; torch and transformers load only when a build runs.
"""
