"""Test-only probe: records what vLLM's DFlash draft computes, inside the server process, so a test can
replay the very same call on our draft in torch and compare logits step by step.

Loaded as `sitecustomize` from the server's PYTHONPATH (vLLM's engine core runs in a spawned process,
which imports sitecustomize too); active only when $DSPARK_DFLASH_PROBE_DIR names a directory. It wraps,
after vLLM imports them (a `sys.meta_path` hook, so nothing of vLLM is imported early):

- `DFlashProposer.propose` (vllm/v1/spec_decode/dflash.py, inherited from llm_base_proposer.py): the
  target's token ids, positions and raw aux hidden states of this step, the bonus token, the attention
  metadata (query_start_loc, seq_lens), the rejected-token counts and the draft tokens it returns;
- `DFlashQwen3ForCausalLM.combine_hidden_states` (fc), `.precompute_and_store_context_kv` (context
  states and positions written to the draft's KV cache), `.forward` (query ids, positions, last hidden
  states) and `.compute_logits` (qwen3_dflash.py); `DFlashQwen3DecoderLayer.forward`: each draft
  layer's input, residual and output (to find the layer where a replay parts from vLLM).

vLLM's DSpark speculator (V2 runner) is another proposer and is not recorded. Each proposal is one file
`<pid>-<n>.pt` (torch.save of a dict of CPU tensors); reading it needs only torch. Nothing here changes
what vLLM computes (every tensor is cloned)."""

import os

_DIR = os.environ.get("DSPARK_DFLASH_PROBE_DIR")

if _DIR:
    import importlib.abc
    import sys

    _PATCHES = {}  # module name → function(module) that wraps its classes
    _state = {"n": 0, "record": None}

    def _clone(x):
        import torch

        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu").clone()
        return x

    def _patch_proposer(module):
        cls = module.DFlashProposer
        inner = cls.propose

        def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                    next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                    *args, **kwargs):
            import torch

            rejected = kwargs.get("num_rejected_tokens_gpu")
            record = {
                "num_speculative_tokens": int(num_speculative_tokens),
                "target_token_ids": _clone(target_token_ids),
                "target_positions": _clone(target_positions),
                "target_hidden_states": _clone(target_hidden_states),
                "next_token_ids": _clone(next_token_ids),
                "query_start_loc": _clone(common_attn_metadata.query_start_loc),
                "seq_lens": _clone(common_attn_metadata.seq_lens),
                "num_rejected_tokens": _clone(rejected),
                "calls": [],
            }
            _state["record"] = record
            try:
                out = inner(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                            next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                            *args, **kwargs)
            finally:
                _state["record"] = None
            record["draft_token_ids"] = _clone(out)
            _state["n"] += 1
            os.makedirs(_DIR, exist_ok=True)
            torch.save(record, os.path.join(_DIR, f"{os.getpid()}-{_state['n']:05d}.pt"))
            return out

        cls.propose = propose

    def _patch_model(module):
        cls = module.DFlashQwen3ForCausalLM
        layer_cls = module.DFlashQwen3DecoderLayer

        inner_layer = layer_cls.forward

        def layer_forward(self, positions, hidden_states, residual):
            out = inner_layer(self, positions, hidden_states, residual)
            record = _state["record"]
            if record is not None:
                record["calls"].append({"name": "layer", "hidden_states": _clone(hidden_states),
                                        "residual": _clone(residual), "out": tuple(_clone(o) for o in out)})
            return out

        layer_cls.forward = layer_forward

        def wrap(name, describe):
            inner = getattr(cls, name)

            def method(self, *args, **kwargs):
                out = inner(self, *args, **kwargs)
                record = _state["record"]
                if record is not None:
                    record["calls"].append({"name": name, **describe(args, kwargs, out)})
                return out

            setattr(cls, name, method)

        def arg(args, kwargs, i, key):
            return args[i] if len(args) > i else kwargs.get(key)

        wrap("combine_hidden_states", lambda a, k, out: {"out": _clone(out)})
        wrap("precompute_and_store_context_kv", lambda a, k, out: {
            "context_states": _clone(arg(a, k, 0, "context_states")),
            "context_positions": _clone(arg(a, k, 1, "context_positions")),
            "context_slot_mapping": _clone(arg(a, k, 2, "context_slot_mapping"))})
        wrap("forward", lambda a, k, out: {
            "input_ids": _clone(arg(a, k, 0, "input_ids")), "positions": _clone(arg(a, k, 1, "positions")),
            "out": _clone(out)})
        wrap("compute_logits", lambda a, k, out: {"hidden_states": _clone(arg(a, k, 0, "hidden_states")),
                                                  "out": _clone(out)})

    _PATCHES["vllm.v1.spec_decode.dflash"] = _patch_proposer
    _PATCHES["vllm.model_executor.models.qwen3_dflash"] = _patch_model

    class _Finder(importlib.abc.MetaPathFinder):
        """Lets the normal finders find the module, then wraps its loader's exec_module."""

        def find_spec(self, fullname, path, target=None):
            if fullname not in _PATCHES:
                return None
            sys.meta_path.remove(self)
            try:
                import importlib.util

                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            loader, patch = spec.loader, _PATCHES[fullname]

            class _Loader(importlib.abc.Loader):
                def create_module(self, spec):
                    return loader.create_module(spec)

                def exec_module(self, module):
                    loader.exec_module(module)
                    patch(module)

            spec.loader = _Loader()
            return spec

    sys.meta_path.insert(0, _Finder())
