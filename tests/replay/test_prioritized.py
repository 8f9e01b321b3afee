"""Prioritized replay: sampling frequencies, importance weights, beta schedule, updates, TorchRL plug-in."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, ReplayBuffer

from tdrl.replay import PrioritizedSampler, ReplayError, SumTree, TransitionReplayBuffer
from tests.replay.helpers import make_stream


def _chi2_critical(dof: int, alpha: float = 0.01) -> float:
    """Upper ``alpha`` quantile of chi-square(dof), Wilson-Hilferty approximation (accurate to <1% for dof>=30)."""
    z = {0.01: 2.326347874}[alpha]
    h = 2.0 / (9.0 * dof)
    return dof * (1.0 - h + z * math.sqrt(h)) ** 3


def _flat_buffer(tmp_path, n: int, **sampler_kwargs) -> TransitionReplayBuffer:
    sampler = PrioritizedSampler(seed=3, **sampler_kwargs)
    rb = TransitionReplayBuffer(tmp_path / "rb", n, sampler=sampler, seed=0)
    rb.extend(make_stream(1, n).reshape(-1))
    return rb


def test_sum_tree_find_matches_prefix_sums():
    rng = np.random.default_rng(0)
    for capacity, k in [(1, 2), (7, 2), (300, 2), (1000, 4), (5000, 16), (70_000, 16)]:
        tree = SumTree(capacity, k)
        values = rng.random(capacity) * (rng.random(capacity) < 0.7)
        tree.update(np.arange(capacity), values)
        assert tree.total == pytest.approx(values.sum())
        cumsum = np.cumsum(values)
        mass = rng.random(2000) * values.sum()
        expected = np.searchsorted(cumsum, mass, side="right")
        assert np.array_equal(tree.find(mass), expected)
        assert np.all(values[tree.find(np.full(5, values.sum()))] > 0)  # mass at the very end: no zero leaf
        tree.rebuild()
        assert tree.total == pytest.approx(values.sum())


def test_sampling_frequencies_match_p_alpha_chi_square(tmp_path):
    n, alpha = 40, 0.7
    rb = _flat_buffer(tmp_path, n, alpha=alpha)
    raw = np.random.default_rng(1).uniform(0.1, 5.0, n)
    rb.update_priority(torch.arange(n), torch.as_tensor(raw))
    counts = np.zeros(n)
    draws = 0
    for _ in range(400):
        s = rb.sample(40)
        counts += np.bincount(s["index"].numpy(), minlength=n)
        draws += 40
    p = (raw + rb.sampler.eps) ** alpha
    expected = draws * p / p.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < _chi2_critical(n - 1), f"chi2={chi2:.1f}"
    # and the test has power: uniform frequencies are rejected
    uniform = np.full(n, draws / n)
    assert float(((counts - uniform) ** 2 / uniform).sum()) > _chi2_critical(n - 1)


def test_importance_weights_equal_formula(tmp_path):
    n, alpha = 30, 0.6
    rb = _flat_buffer(tmp_path, n, alpha=alpha, beta_init=0.5, beta_final=0.5)
    raw = np.linspace(0.0, 3.0, n)
    rb.update_priority(torch.arange(n), torch.as_tensor(raw))
    s = rb.sample(30)
    idx = s["index"].numpy()
    prob = (raw + rb.sampler.eps) ** alpha
    prob = prob / prob.sum()
    w = (n * prob[idx]) ** -0.5
    w = w / w.max()
    np.testing.assert_allclose(s["priority_weight"].numpy(), w, rtol=1e-5)
    assert s["priority_weight"].dtype == torch.float32


def test_beta_anneals_linearly_then_holds(tmp_path):
    sampler = PrioritizedSampler(alpha=0.6, beta_init=0.4, beta_final=1.0, beta_steps=1000)
    rb = TransitionReplayBuffer(tmp_path / "rb", 4000, sampler=sampler)
    betas = []
    for i in range(15):
        rb.extend(make_stream(4, 25, seed=i))  # 100 transitions per extend
        betas.append(sampler.beta)
    expected = [0.4 + 0.6 * min(1.0, 100 * (i + 1) / 1000) for i in range(15)]
    np.testing.assert_allclose(betas, expected)


def test_priority_update_changes_sampling(tmp_path):
    n = 64
    rb = _flat_buffer(tmp_path, n, alpha=1.0)
    before = np.bincount(rb.sample(64)["index"].numpy(), minlength=n)
    assert before.max() <= 8  # all default priority: spread out
    rb.update_priority(torch.tensor([5]), torch.tensor([1000.0]))
    after = np.bincount(rb.sample(64)["index"].numpy(), minlength=n)
    assert after[5] > 40
    # a sampled TensorDict with td_error works too (what TorchRL losses write)
    s = rb.sample(16)
    s["td_error"] = torch.zeros(16)
    rb.update_priority(s)
    assert rb.sampler.priorities(s["index"].numpy()).max() == 0.0


def test_input_priorities_and_default_priority(tmp_path):
    sampler = PrioritizedSampler(alpha=1.0, default_priority=2.0)
    rb = TransitionReplayBuffer(tmp_path / "rb", 100, sampler=sampler)
    batch = make_stream(2, 10)
    batch["priority"] = torch.arange(20, dtype=torch.float32).reshape(2, 10)
    rb.extend(batch)
    idx = rb.ring.leaves_of(0, 10)
    np.testing.assert_allclose(sampler.priorities(idx), batch["priority"].reshape(-1).numpy())
    rb.extend(make_stream(2, 10, seed=1))
    np.testing.assert_allclose(sampler.priorities(rb.ring.leaves_of(10, 20)), 2.0)
    assert "priority" not in rb.sample(4).keys()


def test_bad_priorities_raise_and_change_nothing(tmp_path):
    rb = _flat_buffer(tmp_path, 20, alpha=0.6)
    leaves = rb.sampler.leaf_values(np.arange(20)).copy()
    with pytest.raises(ReplayError, match="NaN"):
        rb.update_priority(torch.arange(3), torch.tensor([1.0, float("nan"), 1.0]))
    with pytest.raises(ReplayError, match="negative"):
        rb.update_priority(torch.arange(3), torch.tensor([1.0, -1.0, 1.0]))
    with pytest.raises(ReplayError, match="3 values for 2"):
        rb.update_priority(torch.arange(2), torch.ones(3))
    bad = make_stream(1, 5).reshape(-1)
    bad["priority"] = torch.tensor([1.0, 2.0, float("inf"), 1.0, 1.0])
    with pytest.raises(ReplayError, match="priority"):
        rb.extend(bad)
    np.testing.assert_array_equal(rb.sampler.leaf_values(np.arange(20)), leaves)
    assert rb.write_count == 20


def test_nstep_windows_never_cross_cursor_prioritized(tmp_path):
    sampler = PrioritizedSampler(alpha=0.6, seed=0)
    rb = TransitionReplayBuffer(tmp_path / "rb", 2 * 50, sampler=sampler, n_step=4, gamma=0.9)
    stream = make_stream(2, 200)
    for start in range(0, 200, 10):
        rb.extend(stream[:, start : start + 10])
        n = rb.ready_count()
        s = rb.sample(min(n, 32))
        t = s["observation"][:, 0].long() % 10_000
        newest = start + 9
        assert int(t.max()) <= newest - 3 and int(t.min()) >= max(0, newest + 1 - 50)
        # the tree holds exactly the ready windows
        assert int((sampler.leaf_values(np.arange(100)) > 0).sum()) == n


def test_plugs_into_torchrl_replay_buffer(tmp_path):
    sampler = PrioritizedSampler(100, alpha=1.0, beta_init=1.0, beta_final=1.0, seed=0)
    rb = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path / "trl"), sampler=sampler, batch_size=32)
    data = TensorDict({"obs": torch.arange(50).float()}, batch_size=[50])
    rb.extend(data)
    rb.update_priority(torch.arange(50), torch.where(torch.arange(50) == 7, 1000.0, 1e-3))
    sample, info = rb.sample(return_info=True)
    assert (sample["obs"] == 7).float().mean() > 0.9
    assert "priority_weight" in info
    rb.dumps(tmp_path / "dump")
    fresh = PrioritizedSampler(100, alpha=1.0)
    rb2 = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path / "trl2"), sampler=fresh, batch_size=32)
    rb2.loads(tmp_path / "dump")
    np.testing.assert_array_equal(fresh.leaf_values(np.arange(100)), sampler.leaf_values(np.arange(100)))
    assert np.array_equal(fresh.draw(16)[0], sampler.draw(16)[0])  # same RNG state, same tree: same draws
