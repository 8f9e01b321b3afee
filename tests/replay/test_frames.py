"""Frame de-duplication: rebuilt stacks equal the stacks a naive buffer stores, at ~1/4 of the memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tdrl.replay import FrameStack, PrioritizedSampler, ReplayError, TransitionReplayBuffer
from tests.replay.helpers import F, atari_episodes

H, W = 84, 84


@pytest.mark.parametrize("padding,n_step,prioritized", [("zero", 1, False), ("reset", 3, False), ("zero", 2, True)])
def test_rebuilt_stacks_equal_naive_stacks(tmp_path, padding, n_step, prioritized):
    B, T, chunk = 2, 96, 24
    data = atari_episodes(B, T, seed=1, padding=padding)
    capacity = B * 40  # wraps: frames from overwritten steps must not leak into stacks
    sampler = PrioritizedSampler(alpha=0.6, seed=0) if prioritized else None
    rb = TransitionReplayBuffer(tmp_path / "rb", capacity, n_step=n_step, gamma=0.9, sampler=sampler,
                                frame_stack=FrameStack(F, padding=padding, slack=0.25), seed=0)
    naive = TransitionReplayBuffer(tmp_path / "naive", capacity, n_step=n_step, gamma=0.9, seed=0)
    starts_seen = 0
    for start in range(0, T, chunk):
        part = data[:, start : start + chunk]
        rb.extend(part)
        naive.extend(part)
        n = rb.ready_count()
        # one step less at the new end (the next stack needs the next frame), F-1 less at the old end once wrapped
        assert n == naive.ready_count() - B * (1 + (F - 1) * (start + chunk > 40))
        if prioritized:  # the tree holds exactly the sampleable starts
            assert int((sampler.leaf_values(np.arange(capacity)) > 0).sum()) == n
        s = rb.sample(min(n, 64))
        b = s["index"] // rb.ring.time_capacity
        t = s["action"]
        for i in range(s.shape[0]):
            bi, ti = int(b[i]), int(t[i])
            assert torch.equal(s["observation"][i], data["observation"][bi, ti])
            k = int(s["steps_to_next_obs"][i, 0]) if n_step > 1 else 1
            assert torch.equal(s["next", "observation"][i], data["next", "observation"][bi, ti + k - 1])
            starts_seen += int(data["is_init"][bi, ti, 0])
    assert starts_seen > 0, "the test should cover episode starts"


def test_padding_mismatch_is_an_error(tmp_path):
    data = atari_episodes(2, 20, seed=0, padding="reset")
    rb = TransitionReplayBuffer(tmp_path / "rb", 100, frame_stack=FrameStack(F, padding="zero"))
    with pytest.raises(ReplayError, match="padding='reset'"):
        rb.extend(data)


def test_frame_memory_is_about_a_quarter(tmp_path):
    B, T = 4, 64
    data = atari_episodes(B, T, seed=0, padding="zero", mean_len=50)
    capacity = 4 * 1024
    rb = TransitionReplayBuffer(tmp_path / "rb", capacity, frame_stack=FrameStack(F), seed=0)
    rb.extend(data)
    stacked_obs = capacity * F * H * W  # a naive buffer's observation stacks alone
    ours = rb.ring.store.nbytes() - sum(v.numel() * v.element_size() for v in rb.ring.fields.values())
    assert 0.24 < ours / stacked_obs < 0.29
    # 1M transitions of 4x84x84: layout sizes without allocating
    fields = FrameStack(F).fields(data, B, 1_000_000 // B)
    nbytes = sum(int(np.prod(shape)) * torch.empty((), dtype=dt).element_size() for shape, dt, _ in fields.values())
    assert nbytes / (1_000_000 * F * H * W) < 0.28


def test_episodes_too_short_for_slack_raise_before_writing(tmp_path):
    B, T = 1, 40
    data = atari_episodes(B, T, seed=0, padding="zero", mean_len=2)
    rb = TransitionReplayBuffer(tmp_path / "rb", 40, frame_stack=FrameStack(F, slack=1 / 16), seed=0)
    rb.extend(data[:, :20])
    with pytest.raises(ReplayError, match="slack"):
        for start in range(20, 400, 20):
            before = rb.write_count, rb.ring.field("frames.written").clone()
            rb.extend(atari_episodes(B, 20, seed=start, padding="zero", mean_len=2))
    assert rb.write_count == before[0]
    assert torch.equal(rb.ring.field("frames.written"), before[1])
