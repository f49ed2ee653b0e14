"""Shared fixtures: tiny Hugging Face targets built from a config (no hub), and untrained drafts for them."""

from __future__ import annotations

import os

import pytest
import torch

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's waiting threads
# make them 10–50× slower: tests run single-threaded; a test that wants more uses `torch_threads`.
torch.set_num_threads(1)


@pytest.fixture
def torch_threads():
    """Set the torch thread count for one test and restore it afterwards: `torch_threads(2)`."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def tiny_qwen3(vocab_size: int = 96, hidden_size: int = 32, num_layers: int = 4, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
        max_position_embeddings=512, tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(cfg).eval()
    # Sharper-than-init logits, so greedy argmax has no near-ties and sampling is not near-uniform.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def tiny_llama(vocab_size: int = 96, hidden_size: int = 32, num_layers: int = 3, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def qwen3_target():
    from dspark_core.target import TargetModel

    return TargetModel(tiny_qwen3())


@pytest.fixture(scope="session")
def llama_target():
    from dspark_core.target import TargetModel

    return TargetModel(tiny_llama())


@pytest.fixture
def data_env(monkeypatch):
    """Task data from $HARNESS_DATA_DIR, else ../shared/datasets beside the repository; skip without either."""
    from pathlib import Path

    if not os.environ.get("HARNESS_DATA_DIR"):
        shared = Path(__file__).resolve().parents[2] / "shared" / "datasets"
        if not shared.is_dir():
            pytest.skip("needs HARNESS_DATA_DIR (../shared/datasets)")
        monkeypatch.setenv("HARNESS_DATA_DIR", str(shared))
