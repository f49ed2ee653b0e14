"""`DeferredObservations` (dspark_core/drafters/deferred.py): what the wrapped drafter sees, and when, and the
memory its parked observations may take."""

from __future__ import annotations

import torch

from dspark_core.drafters.base import DraftProposal, DraftStep, StatelessDrafter
from dspark_core.drafters.deferred import MAX_PARKED_BYTES, DeferredObservations

NUM_FEATURES = 4  # float32: 16 bytes a position


class Recorder(StatelessDrafter):
    """Test double of the wrapped drafter (outside the unit): keeps, per slot, every (token, feature) it was
    given, and at each propose how many positions each drafted row had been given."""

    name = "recorder"
    target_layer_ids = (0,)

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    def start(self, num_slots: int, capacity: int) -> list[list[tuple[int, float]]]:
        return [[] for _ in range(num_slots)]

    def reset(self, state, rows) -> None:
        for row in rows.tolist():
            state[row].clear()

    def observe(self, state, rows, token_ids, features, num_new) -> None:
        self.calls.append(("observe", rows.tolist()))
        for i, (row, n) in enumerate(zip(rows.tolist(), num_new.tolist())):
            state[row] += [(int(t), float(f)) for t, f in zip(token_ids[i, :n], features[i, :n, 0])]

    def propose(self, state, step: DraftStep) -> DraftProposal:
        self.calls.append(("propose", [len(state[row]) for row in step.rows.tolist()]))
        return DraftProposal(torch.zeros(len(step.rows), step.num_drafts, dtype=torch.long), None, None)


def observe(wrapper, state, sent, rows: list[int], tokens: list[list[int]]) -> None:
    """Observe `tokens[i]` for slot rows[i] (right-padded), each position's feature 0 = its token; `sent`
    keeps what the wrapper was given, per slot."""
    width = max(len(t) for t in tokens)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, t in enumerate(tokens):
        ids[i, : len(t)] = torch.tensor(t)
        sent[rows[i]] += t
    features = ids[:, :, None].float().expand(-1, -1, NUM_FEATURES).contiguous()
    wrapper.observe(state, torch.tensor(rows), ids, features, torch.tensor([len(t) for t in tokens]))


def propose(wrapper, state, rows: list[int]) -> None:
    num_tokens = torch.zeros(3, dtype=torch.long)
    wrapper.propose(state, DraftStep(torch.tensor(rows), torch.zeros(3, 32, dtype=torch.long), num_tokens, 2,
                                     torch.zeros(len(rows)), []))


def test_parked_observations_reach_the_drafter_in_order_before_it_drafts_within_the_bound():
    """Five positions a slot (80 bytes): a 3-token prompt is parked, an 8-token one goes through at once; steps
    without drafts park one position each, a full slot hands its five over first; a draft hands over what its
    rows hold; the observation after a draft goes through; the buffers never grow past 3 slots × 80 bytes."""
    inner = Recorder()
    wrapper = DeferredObservations(inner, max_parked_bytes=5 * NUM_FEATURES * 4)
    state = wrapper.start(3, 32)
    sent: dict[int, list[int]] = {0: [], 1: [], 2: []}
    observe(wrapper, state, sent, [0, 1], [[10, 11, 12], [20, 21, 22, 23, 24, 25, 26, 27]])  # the prefill
    assert inner.calls == [("observe", [1])] and state.count == [3, 0, 0]
    assert state.max_parked == 5 and state.features.numel() * state.features.element_size() == 3 * 80
    for token in range(3):  # three steps without drafts
        observe(wrapper, state, sent, [0, 1], [[13 + token], [28 + token]])
    assert inner.calls[1:] == [("observe", [0])] and state.count == [1, 3, 0]  # slot 0 was full at its third
    propose(wrapper, state, [0])  # only slot 0 drafts: its parked position goes over first
    assert inner.calls[2:] == [("observe", [0]), ("propose", [6])] and state.count == [0, 3, 0]
    observe(wrapper, state, sent, [0, 1], [[16, 17], [31]])  # slot 0 just drafted: through; slot 1 parks
    assert inner.calls[4:] == [("observe", [0])] and state.count == [0, 4, 0]
    propose(wrapper, state, [0, 1])
    assert inner.calls[5:] == [("observe", [1]), ("propose", [8, 12])]
    assert {row: [t for t, _ in seen] for row, seen in enumerate(state.inner)} == sent  # every position, in order
    assert all(float(t) == f for seen in state.inner for t, f in seen)  # each with its own features
    wrapper.reset(state, torch.tensor([0, 1]))
    assert state.count == [0, 0, 0] and state.inner == [[], [], []]


def test_the_default_bound_for_an_8b_target():
    """An 8 B target whose draft reads 5 layers of 4,096 in bf16 (40 KiB a position): a slot parks at most 204
    positions, 8 MiB, where holding a whole 2,048-token prompt took ≈ 84 MB."""
    wrapper = DeferredObservations(Recorder())
    state = wrapper.start(1, 4096)
    features = torch.zeros(1, 1, 5 * 4096, dtype=torch.bfloat16)
    wrapper.observe(state, torch.tensor([0]), torch.zeros(1, 1, dtype=torch.long), features, torch.tensor([1]))
    assert state.max_parked == 204 and state.count == [1]
    assert state.features.numel() * state.features.element_size() <= MAX_PARKED_BYTES == 8 << 20
