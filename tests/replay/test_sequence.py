"""R2D1 sequence replay: starts only at stored states, right initial state, prioritized starts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tdrl.replay import PrioritizedSampler, ReplayError, SequenceReplayBuffer, sequence_priority
from tests.replay.helpers import make_stream

STATE = ("recurrent_state", "h")


def _batch(B, T, t0, seed=0):
    td = make_stream(B, T, seed=seed)
    time = torch.arange(t0, t0 + T, dtype=torch.float32).expand(B, T)
    code = torch.arange(B, dtype=torch.float32).unsqueeze(1) * 10_000 + time
    td["observation"] = code.unsqueeze(-1).repeat(1, 1, 3)
    td[STATE] = torch.stack([code, -code], dim=-1).unsqueeze(2).repeat(1, 1, 2, 1)  # [B, T, layers=2, 2]
    td["next", STATE] = td[STATE] + 0.5
    return td


def _build(tmp_path, sampler=None, capacity=3 * 96):
    return SequenceReplayBuffer(tmp_path / "seq", capacity, warmup_T=4, batch_T=8, lookahead_T=2,
                                rnn_state_interval=8, state_keys=[STATE], sampler=sampler, seed=0)


@pytest.mark.parametrize("prioritized", [False, True])
def test_sequences_start_at_stored_states_with_their_state(tmp_path, prioritized):
    sampler = PrioritizedSampler(alpha=0.6, seed=0) if prioritized else None
    rb = _build(tmp_path, sampler)
    B, L = 3, 14
    t0 = 0
    for chunk in [10, 7, 13, 20, 32, 40, 9, 30]:  # batch lengths not aligned to the interval; the ring wraps
        rb.extend(_batch(B, chunk, t0, seed=t0))
        t0 += chunk
        n = rb.ready_count()
        if n == 0:
            continue
        s = rb.sample(min(n, 8))
        assert s.batch_size == torch.Size([min(n, 8), L])
        code = s["observation"][..., 0].long()
        b, t = code // 10_000, code % 10_000
        assert bool((t[:, 0] % 8 == 0).all()), "a sequence started between stored states"
        assert bool((t - t[:, :1] == torch.arange(L)).all()), "steps are not consecutive"
        assert bool((b == b[:, :1]).all())
        assert int(t.max()) <= t0 - 1 and int(t.min()) >= max(0, t0 - 96)
        # the initial state is the state stored at the start step, broadcast along time
        expected = torch.stack([code[:, 0].float(), -code[:, 0].float()], -1).unsqueeze(1).repeat(1, 2, 1)
        assert torch.equal(s[STATE][:, 0], expected)
        assert s[STATE].stride(1) == 0
        assert ("next", *STATE) not in s.keys(include_nested=True)
        if prioritized:
            assert int((sampler.leaf_values(np.arange(rb.ring.num_leaves)) > 0).sum()) == n


def test_prioritized_sequences_eta_priority_and_input_priorities(tmp_path):
    sampler = PrioritizedSampler(alpha=1.0, seed=0)
    rb = _build(tmp_path, sampler)
    batch = _batch(3, 64, 0)
    batch["priority"] = torch.zeros(3, 64)
    batch["priority"][1, 16] = 50.0  # input priority of the start at t=16 in stream 1
    rb.extend(batch)
    s = rb.sample(16)
    start_t = s["observation"][:, 0, 0].long()
    assert (start_t == 10_000 + 16).float().mean() > 0.8
    td = torch.rand(16, 8)
    rb.update_priority(s["index"], td)
    expected = 0.9 * td.abs().max(1).values + 0.1 * td.abs().mean(1)
    torch.testing.assert_close(sequence_priority(td, 0.9), expected)
    got = sampler.priorities(s["index"][:, 0].numpy())
    # duplicates: the last write wins
    last = {int(i): float(p) for i, p in zip(s["index"][:, 0], expected, strict=True)}
    np.testing.assert_allclose(got, [last[int(i)] for i in s["index"][:, 0]], rtol=1e-6)
    with pytest.raises(ReplayError, match="NaN"):
        rb.update_priority(s["index"], torch.full((16, 8), float("nan")))


def test_bad_state_and_batch_errors(tmp_path):
    rb = _build(tmp_path)
    rb.extend(_batch(3, 20, 0))
    bad = _batch(3, 20, 20)
    bad[STATE] = bad[STATE][..., :1]
    with pytest.raises(ReplayError, match="recurrent_state.h"):
        rb.extend(bad)
    with pytest.raises(ReplayError, match="recurrent_state.h"):
        rb.extend(_batch(3, 20, 20).exclude(STATE))
    with pytest.raises(ReplayError, match=r"\[B, T\]"):
        rb.extend(_batch(3, 20, 20).reshape(-1))
    with pytest.raises(ReplayError, match="batch_B=100 exceeds"):
        rb.sample(100)
    assert rb.write_count == 60


def test_sequence_dumps_loads_same_samples(tmp_path):
    sampler = PrioritizedSampler(alpha=0.6, seed=0)
    rb = _build(tmp_path / "a", sampler)
    for i in range(5):
        rb.extend(_batch(3, 40, 40 * i, seed=i))
    rb.update_priority(rb.sample(8)["index"], torch.rand(8) * 3)
    rb.dumps(tmp_path / "dump")
    expected = [rb.sample(8) for _ in range(3)]
    other = _build(tmp_path / "b", PrioritizedSampler(alpha=0.6))
    other.loads(tmp_path / "dump")
    for want in expected:
        got = other.sample(8)
        assert (got == want).all()
