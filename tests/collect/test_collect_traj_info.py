"""EpisodeTracker (vectorised per block) against a plain per-step loop, incl. wait-reset masks and discounts."""

from __future__ import annotations

import numpy as np
import pytest

from tdrl.collect.traj_info import EpisodeTracker


def _per_step_reference(rewards, dones, valid, discount, state):
    out = []
    n, k = rewards.shape
    for i in range(n):
        for t in range(k):
            if valid is not None and not valid[i, t]:
                continue
            s = state[i]
            s["Return"] += rewards[i, t]
            s["DiscountedReturn"] += s["pow"] * rewards[i, t]
            s["pow"] *= discount
            s["Length"] += 1
            s["NonzeroRewards"] += int(rewards[i, t] != 0)
            if dones[i, t]:
                out.append((t, i, {f: v for f, v in s.items() if f != "pow"}))
                state[i] = _fresh()
    return out


def _fresh():
    return {"Return": 0.0, "DiscountedReturn": 0.0, "pow": 1.0, "Length": 0, "NonzeroRewards": 0}


@pytest.mark.parametrize("discount", [0.99, 0.9, 0.5, 1.0, 0.0])
def test_tracker_matches_per_step_loop(discount):
    rng = np.random.default_rng(int(discount * 100))
    for _ in range(40):
        n, k = int(rng.integers(1, 6)), int(rng.integers(1, 60))
        tracker = EpisodeTracker(n, discount)
        state = [_fresh() for _ in range(n)]
        for _block in range(4):
            rewards = (rng.integers(-2, 3, (n, k)) * rng.random((n, k)).round(1)).astype(np.float64)
            dones = rng.random((n, k)) < 0.15
            valid = None
            if rng.random() < 0.3:  # wait-reset: steps after the first done are invalid
                valid = np.ones((n, k), bool)
                for i in range(n):
                    ends = np.flatnonzero(dones[i])
                    if len(ends):
                        valid[i, ends[0] + 1 :] = False
            got = tracker.add(rewards, dones, valid)
            expected = _per_step_reference(rewards, dones, valid, discount, state)
            key = lambda e: (e[1], e[0])  # noqa: E731
            assert [(t, i) for t, i, _ in sorted(got, key=key)] == [(t, i) for t, i, _ in sorted(expected, key=key)]
            for (_, _, a), (_, _, b) in zip(sorted(got, key=key), sorted(expected, key=key), strict=True):
                assert a == pytest.approx(b, rel=1e-9, abs=1e-9)


def test_small_and_large_blocks_carry_episodes_across_each_other():
    """One tracker fed blocks on both sides of SMALL_BLOCK (step-by-step and prefix-sum paths): episodes spanning
    blocks of either kind, in the vectorised path's order (env, then time)."""
    from tdrl.collect.traj_info import SMALL_BLOCK

    rng = np.random.default_rng(3)
    n = 4
    tracker = EpisodeTracker(n, 0.97)
    state = [_fresh() for _ in range(n)]
    sizes = [1, 1, 60, 1, SMALL_BLOCK // n, SMALL_BLOCK // n + 1, 2, 45, 1]
    for k in sizes * 3:
        rewards = rng.integers(-1, 3, (n, k)).astype(np.float64)
        dones = rng.random((n, k)) < 0.1
        got = tracker.add(rewards, dones)
        expected = sorted(_per_step_reference(rewards, dones, None, 0.97, state), key=lambda e: (e[1], e[0]))
        assert [(t, i) for t, i, _ in got] == [(t, i) for t, i, _ in expected]
        for (_, _, a), (_, _, b) in zip(got, expected, strict=True):
            assert a == pytest.approx(b, rel=1e-9, abs=1e-9)


def test_long_blocks_with_small_discount_stay_finite():
    tracker = EpisodeTracker(2, 0.5)
    rewards = np.ones((2, 3000))
    dones = np.zeros((2, 3000), bool)
    dones[:, -1] = True
    infos = tracker.add(rewards, dones)
    assert len(infos) == 2
    assert all(info["DiscountedReturn"] == pytest.approx(2.0) and info["Length"] == 3000 for _, _, info in infos)

