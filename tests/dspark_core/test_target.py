"""`TargetModel.forward` over KV slots must equal a plain full forward of each sequence.

The slot cache is the part of the target wrapper that plain Hugging Face never exercises: rows of
different lengths right-padded into one call, rollback by lowering a length (stale keys/values stay
in memory), forwards over a subset of slots in any order. Every chunk's logits and features are
compared with `model(input_ids=whole_sequence)` on that row's committed tokens.
"""

from __future__ import annotations

import pytest
import torch

from dspark_core.kv_slots import KVSlots
from dspark_core.target import TargetModel, default_target_layer_ids

ATOL = 1e-4


class Mirror:
    """What the slots should hold: each row's committed tokens, mirrored in plain Python."""

    def __init__(self, target: TargetModel, num_rows: int, capacity: int):
        self.target = target
        self.cache = target.new_cache(num_rows, capacity)
        self.tokens: list[list[int]] = [[] for _ in range(num_rows)]

    def forward_and_check(self, rows: list[int], chunks: list[list[int]], pad_id: int = 5) -> None:
        """Forward right-padded `chunks` after slots `rows`, then compare with full forwards."""
        max_new = max(len(c) for c in chunks)
        token_ids = torch.full((len(rows), max_new), pad_id, dtype=torch.long)
        for j, c in enumerate(chunks):
            token_ids[j, : len(c)] = torch.tensor(c)
        num_new = torch.tensor([len(c) for c in chunks])
        out = self.target.forward(self.cache, torch.tensor(rows), token_ids, num_new)
        vocab = self.target.vocab_size
        assert out.logits.shape == (len(rows), max_new, vocab)
        assert out.logits.dtype == torch.float32
        assert out.features.shape == (len(rows), max_new, len(self.target.layer_ids) * self.target.hidden_size)
        for j, (row, chunk) in enumerate(zip(rows, chunks)):
            self.tokens[row] += chunk
            full = self.target.model(
                input_ids=torch.tensor([self.tokens[row]]), output_hidden_states=True
            )
            new = slice(len(self.tokens[row]) - len(chunk), len(self.tokens[row]))
            torch.testing.assert_close(out.logits[j, : len(chunk)], full.logits[0, new].float(), atol=ATOL, rtol=1e-4)
            expected_features = torch.cat([full.hidden_states[i + 1][0, new] for i in self.target.layer_ids], dim=-1)
            torch.testing.assert_close(out.features[j, : len(chunk)], expected_features, atol=ATOL, rtol=1e-4)
        assert self.cache.lengths.tolist() == [len(t) for t in self.tokens]

    def rollback(self, rows: list[int], lengths: list[int]) -> None:
        self.cache.rollback(torch.tensor(rows), torch.tensor(lengths))
        for row, n in zip(rows, lengths):
            del self.tokens[row][n:]


def _tokens(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


@pytest.fixture(params=["qwen3", "llama"])
def target(request, qwen3_target, llama_target) -> TargetModel:
    base = qwen3_target if request.param == "qwen3" else llama_target
    # Several features, the embeddings (-1) included, on a wrapper sharing the session's model.
    return TargetModel(base.model, layer_ids=(-1, 0, base.num_layers - 2))


def test_slots_match_full_forward_through_rollback(target: TargetModel):
    gen = torch.Generator().manual_seed(1)
    vocab = target.vocab_size
    m = Mirror(target, num_rows=3, capacity=32)
    # Prefill: right-padded prompts of different lengths.
    m.forward_and_check([0, 1, 2], [_tokens(gen, n, vocab) for n in (5, 2, 7)])
    # Verify-shaped chunks of different lengths.
    m.forward_and_check([0, 1, 2], [_tokens(gen, n, vocab) for n in (4, 4, 1)])
    # Reject some of them: stale keys/values stay in memory past each length.
    m.rollback([0, 1, 2], [6, 6, 8])
    # New tokens over the stale positions, on a subset of slots in a different order.
    m.forward_and_check([2, 0], [_tokens(gen, n, vocab) for n in (3, 5)])
    m.rollback([1], [3])
    m.forward_and_check([1, 2, 0], [_tokens(gen, n, vocab) for n in (6, 1, 2)])
    m.forward_and_check([1], [_tokens(gen, 1, vocab)])


def test_no_features_when_no_layers(qwen3_target: TargetModel):
    target = TargetModel(qwen3_target.model, layer_ids=())
    cache = target.new_cache(2, 8)
    out = target.forward(cache, torch.tensor([0, 1]), torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2]))
    assert out.features.shape == (2, 3, 0)
    assert cache.lengths.tolist() == [3, 2]


def test_default_layer_ids():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # the spec's Qwen3 choice
    for num_layers in range(2, 40):
        ids = default_target_layer_ids(num_layers)
        assert list(ids) == sorted(set(ids)) and ids[0] >= 0 and ids[-1] <= num_layers - 2
    with pytest.raises(ValueError):
        default_target_layer_ids(1)


@pytest.mark.parametrize(
    "layer_ids, message",
    [
        ((3,), "last layer"),  # tiny_qwen3 has 4 layers: 3 is the post-norm last one
        ((0, 3), "last layer"),
        ((4,), "out of range"),
        ((-2,), "out of range"),
        ((2, 0), "strictly increasing"),
        ((1, 1), "strictly increasing"),
    ],
)
def test_bad_layer_ids(qwen3_target: TargetModel, layer_ids, message):
    with pytest.raises(ValueError, match=message):
        TargetModel(qwen3_target.model, layer_ids=layer_ids)
    wrapper = TargetModel(qwen3_target.model, layer_ids=(0,))
    with pytest.raises(ValueError, match=message):
        wrapper.set_layer_ids(layer_ids)
    assert wrapper.layer_ids == (0,)  # a refused change leaves the old ids


def test_capacity_overflow(qwen3_target: TargetModel):
    cache = qwen3_target.new_cache(2, 6)
    rows = torch.tensor([0, 1])
    qwen3_target.forward(cache, rows, torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]]), torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="capacity"):
        qwen3_target.forward(cache, rows, torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([3, 3]))
    assert cache.lengths.tolist() == [4, 2]  # the refused forward changed nothing
    # Padding does not count, only valid positions: 4 + 2 and 2 + 3 fit.
    qwen3_target.forward(cache, rows, torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([2, 3]))
    assert cache.lengths.tolist() == [6, 5]
    with pytest.raises(ValueError, match="capacity"):
        qwen3_target.forward(cache, torch.tensor([0]), torch.tensor([[1]]), torch.tensor([1]))


def test_rollback_never_grows():
    slots = KVSlots.allocate(1, 2, 1, 4, 2, torch.float32, "cpu")
    slots.lengths[:] = torch.tensor([3, 1])
    with pytest.raises(ValueError, match="grow"):
        slots.rollback(torch.tensor([0, 1]), torch.tensor([2, 2]))
    assert slots.lengths.tolist() == [3, 1]
    slots.rollback(torch.tensor([0]), torch.tensor([0]))
    assert slots.lengths.tolist() == [0, 1]



def test_one_rows_append_writes_what_the_many_rows_scatter_writes():
    """`append` for one row (every step at concurrency 1) takes slice copies; the slots must end as the general
    scatter leaves them, dtype rounding included, with nothing written past the new positions."""
    gen = torch.Generator().manual_seed(5)
    new = [(torch.randn(1, 2, 4, 3, generator=gen), torch.randn(1, 2, 4, 3, generator=gen)) for _ in range(2)]
    one, many = (KVSlots.allocate(2, 3, 2, 9, 3, torch.bfloat16, "cpu") for _ in range(2))
    for slots in (one, many):
        slots.lengths[:] = torch.tensor([1, 2, 0])
    one.append(torch.tensor([1]), new, torch.tensor([3]))
    idle = [(torch.cat([k, torch.zeros_like(k)]), torch.cat([v, torch.zeros_like(v)])) for k, v in new]
    many.append(torch.tensor([1, 0]), idle, torch.tensor([3, 0]))  # a second row with nothing new: the scatter
    assert one.lengths.tolist() == many.lengths.tolist() == [1, 5, 0]
    for layer in range(2):
        assert torch.equal(one.keys[layer], many.keys[layer]) and torch.equal(one.values[layer], many.values[layer])
    assert torch.equal(one.keys[0][1, :, 2:5], new[0][0][0, :, :3].bfloat16())
    assert not one.keys[0][1, :, 5:].any()

def test_cpu_sdpa_reads_grouped_kv_in_place_and_changes_nothing(qwen3_target: TargetModel):
    """On the CPU, `TargetModel` switches a grouped-KV SDPA model to "dspark_sdpa" (no repeat_kv copy per
    verify step); a copy kept on Hugging Face's own SDPA gives the same logits through prefill, verify-shaped
    chunks and rollback."""
    import copy

    from dspark_core.sdpa_gqa import wants_sdpa_gqa

    assert qwen3_target.config._attn_implementation == "dspark_sdpa"
    reference = copy.deepcopy(qwen3_target.model)
    reference.set_attn_implementation("sdpa")
    assert wants_sdpa_gqa(reference)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, qwen3_target.vocab_size, (3, 12), generator=gen)
    cache = qwen3_target.new_cache(3, 32)
    prefill = qwen3_target.forward(cache, torch.arange(3), tokens[:, :5], torch.tensor([5, 3, 4]))
    chunk = qwen3_target.forward(cache, torch.arange(3), tokens[:, 5:9], torch.tensor([4, 2, 1]))
    cache.rollback(torch.arange(3), torch.tensor([7, 4, 5]))
    after = qwen3_target.forward(cache, torch.tensor([2, 0]), tokens[:2, 9:12], torch.tensor([3, 1]))
    committed = {0: tokens[0, :7].tolist(), 2: tokens[2, :4].tolist() + tokens[2, 5:6].tolist()}
    for j, row in enumerate([2, 0]):
        n = (3, 1)[j]
        seq = committed[row] + tokens[j, 9 : 9 + n].tolist()
        full = reference(input_ids=torch.tensor([seq])).logits[0, -n:].float()
        torch.testing.assert_close(after.logits[j, :n], full, atol=ATOL, rtol=1e-4)
    for r, n in enumerate((5, 3, 4)):
        full = reference(input_ids=tokens[r : r + 1, :n]).logits[0].float()
        torch.testing.assert_close(prefill.logits[r, :n], full, atol=ATOL, rtol=1e-4)
    for r, (p, n) in enumerate(zip((5, 3, 4), (4, 2, 1))):
        seq = tokens[r, :p].tolist() + tokens[r, 5 : 5 + n].tolist()
        full = reference(input_ids=torch.tensor([seq])).logits[0, -n:].float()
        torch.testing.assert_close(chunk.logits[r, :n], full, atol=ATOL, rtol=1e-4)
