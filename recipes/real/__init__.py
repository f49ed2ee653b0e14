"""The drafts of a real pretrained target (`python -m recipes.real.build`); the target itself is resolved by
`inputs/smollm2.py`, through `inputs.model_refs`."""
