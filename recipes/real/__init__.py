"""The drafts of a real pretrained target (`python -m recipes.real.build`); the target itself is resolved by
the harness (`harness/real/smollm2.py`, through `harness.model_refs`)."""
