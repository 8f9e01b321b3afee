"""R2D1's loss against a step-by-step reference: value rescaling, burn-in from the stored state, one initial state
for both networks, n-step double-Q targets, masks, sequence and input priorities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Categorical, Unbounded

from tdrl.envs import EnvSpecs
from tdrl.models.recurrent_q import make_recurrent_q_actor
from tdrl.objectives.r2d1 import R2D1Loss, input_priorities, inverse_value_rescale, value_rescale
from tdrl.replay import PrioritizedSampler, SequenceReplayBuffer
from tdrl.utils.keys import RECURRENT_KEYS

A, OBS, H = 3, 4, 8
W, N, STEPS = 4, 2, 6
L = W + STEPS + N
GAMMA, EPS, ETA = 0.9, 1e-3, 0.9


def test_value_rescale_and_inverse():
    x = torch.tensor([-1e4, -50.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 3.0, 1e3, 1e5], dtype=torch.float64)
    torch.testing.assert_close(inverse_value_rescale(value_rescale(x, EPS), EPS), x, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(value_rescale(inverse_value_rescale(x, EPS), EPS), x, rtol=1e-9, atol=1e-9)
    assert value_rescale(torch.tensor(3.0), EPS).item() == pytest.approx(1.0 + 3e-3)  # sqrt(4) - 1 + eps * 3
    assert value_rescale(torch.tensor(-3.0), EPS).item() == pytest.approx(-1.003)
    assert bool((value_rescale(x).diff() > 0).all())


def _actor(seed=0):
    torch.manual_seed(seed)
    specs = EnvSpecs(Unbounded(shape=(OBS,)), Categorical(A, shape=(), dtype=torch.int64))
    return make_recurrent_q_actor(specs, hidden_sizes=[16], lstm_size=H, head_sizes=[16])


def _sample(B=5, seed=0, with_ends=True):
    g = torch.Generator().manual_seed(seed)
    action = torch.randint(A, (B, L), generator=g)
    terminated = torch.zeros(B, L, 1, dtype=torch.bool)
    truncated = torch.zeros(B, L, 1, dtype=torch.bool)
    is_init = torch.zeros(B, L, 1, dtype=torch.bool)
    mask = torch.ones(B, L, dtype=torch.bool)
    if with_ends:
        terminated[1, W + 2] = True  # an episode ends inside the trained part; the next one starts right after
        is_init[1, W + 3] = True
        truncated[2, W + 4] = True  # a time limit: windows reaching it are not trained on
        is_init[2, W + 5] = True
        terminated[3, 1] = True  # an episode ends during burn-in, and the agent idles (wait-reset) ...
        mask[3, 2:5] = False
        is_init[3, 5] = True  # ... until the next batch starts a new one
    prev_action = torch.nn.functional.one_hot(torch.cat([torch.zeros(B, 1, dtype=torch.long), action[:, :-1]], 1),
                                              A).float()
    prev_action[is_init.squeeze(-1)] = 0.0
    reward = torch.randn(B, L, 1, generator=g) * 3
    prev_reward = torch.cat([torch.zeros(B, 1, 1), reward[:, :-1]], 1).masked_fill(is_init, 0.0)
    h0 = torch.randn(B, 1, 1, H, generator=g).expand(B, L, 1, H)  # the stored state, broadcast along time
    c0 = torch.randn(B, 1, 1, H, generator=g).expand(B, L, 1, H)
    return TensorDict({
        "observation": torch.randn(B, L, OBS, generator=g), "action": action, "prev_action": prev_action,
        "prev_reward": prev_reward, "is_init": is_init, RECURRENT_KEYS[0]: h0, RECURRENT_KEYS[1]: c0,
        "next": {"reward": reward, "terminated": terminated, "truncated": truncated, "done": terminated | truncated},
        ("collector", "mask"): mask, "priority_weight": torch.rand(B, 1, generator=g).expand(B, L) + 0.5,
    }, batch_size=[B, L])


def _reference_q(net, sample):
    """Q-values ``[B, L, A]`` unrolled one step at a time from the stored state, zeroing it at each is_init."""
    h, c = sample[RECURRENT_KEYS[0]][:, 0], sample[RECURRENT_KEYS[1]][:, 0]
    out = []
    for t in range(L):
        keep = (~sample["is_init"][:, t]).float().reshape(-1, 1, 1)
        h, c = h * keep, c * keep
        q, h, c = net(sample["observation"][:, t : t + 1], sample["prev_action"][:, t : t + 1],
                      sample["prev_reward"][:, t : t + 1], h, c)
        out.append(q)
    return torch.cat(out, 1)


def _reference(loss, sample):
    """The loss and per-sequence priorities by explicit loops over sequences and steps."""
    with torch.no_grad():
        q = _reference_q(loss.q_net, sample)
        target_q = _reference_q(loss.target_q_net, sample)
    r = sample["next", "reward"].squeeze(-1)
    term, trunc = sample["next", "terminated"].squeeze(-1), sample["next", "truncated"].squeeze(-1)
    mask, weight = sample["collector", "mask"], sample["priority_weight"][:, 0]
    losses, priorities = [], []
    total, count = 0.0, 0
    for b in range(sample.batch_size[0]):
        deltas = []
        for t in range(W, W + STEPS):
            ret, bootstrap, skip = 0.0, True, False
            for k in range(N):
                ret += GAMMA**k * float(r[b, t + k])
                if trunc[b, t + k]:
                    skip = True
                if term[b, t + k] or trunc[b, t + k]:
                    bootstrap = False
                    break
            if skip or not mask[b, t]:
                continue
            y = ret
            if bootstrap:
                best = int(q[b, t + N].argmax())
                y += GAMMA**N * float(inverse_value_rescale(target_q[b, t + N, best], EPS))
            delta = float(value_rescale(torch.tensor(y), EPS)) - float(q[b, t, sample["action"][b, t]])
            deltas.append(delta)
            total += float(weight[b]) * 0.5 * delta**2
            count += 1
        d = np.abs(deltas) if deltas else np.zeros(1)
        priorities.append(ETA * d.max() + (1 - ETA) * (d.sum() / max(len(deltas), 1)))
        losses.append(deltas)
    return total / count, torch.tensor(priorities, dtype=torch.float32)


@pytest.mark.parametrize("same_target", [True, False])
def test_loss_matches_stepwise_reference(same_target):
    loss = R2D1Loss(_actor(), gamma=GAMMA, n_step=N, warmup_T=W, value_scale_eps=EPS, pri_eta=ETA)
    if not same_target:  # other weights: the online network picks the bootstrap action, the target evaluates it
        loss.target_q_net.load_state_dict(_actor(seed=1).net.state_dict())
    sample = _sample()
    out = loss(sample)
    expected_loss, expected_priority = _reference(loss, sample)
    assert out["loss"].item() == pytest.approx(expected_loss, rel=1e-4)
    torch.testing.assert_close(out["priority"], expected_priority, rtol=1e-4, atol=1e-5)


def test_burn_in_uses_the_stored_state_and_trains_only_after_warmup():
    loss = R2D1Loss(_actor(), gamma=GAMMA, n_step=N, warmup_T=W, value_scale_eps=EPS)
    sample = _sample(with_ends=False)
    sample["observation"] = sample["observation"].clone().requires_grad_(True)
    out = loss(sample)
    out["loss"].backward()
    grad = sample["observation"].grad.abs().sum((0, 2))
    assert bool((grad[:W] == 0).all()), "burn-in steps must not be trained (no gradient through them)"
    assert bool((grad[W : W + STEPS] > 0).all())
    # warmup rewards and actions are not trained on ...
    other = sample.detach().clone()
    other["next", "reward"][:, :W] += 100.0
    other["action"][:, :W] = (other["action"][:, :W] + 1) % A
    assert loss(other)["loss"].item() == pytest.approx(out["loss"].item(), rel=1e-6)
    # ... but the burn-in starts from the stored state
    other = sample.detach().clone()
    other[RECURRENT_KEYS[0]] = other[RECURRENT_KEYS[0]] + 1.0
    assert loss(other)["loss"].item() != pytest.approx(out["loss"].item(), rel=1e-6)


def test_target_network_starts_from_the_stored_state():
    """With equal weights and no burn-in, the target's Q-values are the online ones: both unroll from one state."""
    loss = R2D1Loss(_actor(), gamma=GAMMA, n_step=N, warmup_T=0, value_scale_eps=EPS)
    sample = _sample(with_ends=False)
    calls = []
    for name in ("q_net", "target_q_net"):
        net = getattr(loss, name)
        net.register_forward_hook(lambda m, args, out, name=name: calls.append((name, args[3].clone())))
    loss(sample)
    stored = sample[RECURRENT_KEYS[0]][:, 0]
    assert {name for name, _ in calls} == {"q_net", "target_q_net"}
    for _, h in calls:
        torch.testing.assert_close(h, stored)


def _batch(B=4, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    done[0, 5] = True
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 6:] = False  # wait-reset: env 0 idles after its episode ended
    return TensorDict({
        "action": torch.randint(A, (B, T), generator=g), "action_value": torch.randn(B, T, A, generator=g),
        "next": {"reward": torch.randn(B, T, 1, generator=g), "terminated": done, "truncated": torch.zeros_like(done)},
        ("collector", "mask"): mask,
    }, batch_size=[B, T])


def test_input_priorities_from_recorded_q_values():
    batch = _batch()
    got = input_priorities(batch, gamma=GAMMA, n_step=N, eta=ETA, value_scale_eps=EPS)
    assert got.shape == (4, 12) and bool((got == got[:, :1]).all())
    q, a, r = batch["action_value"], batch["action"], batch["next", "reward"].squeeze(-1)
    done, mask = batch["next", "terminated"].squeeze(-1), batch["collector", "mask"]
    for b in range(4):
        deltas = []
        for t in range(12 - N):
            if not mask[b, t]:
                continue
            ret, boot = 0.0, True
            for k in range(N):
                ret += GAMMA**k * float(r[b, t + k])
                if done[b, t + k]:
                    boot = False
                    break
            y = ret + (GAMMA**N * float(inverse_value_rescale(q[b, t + N].max(), EPS)) if boot else 0.0)
            deltas.append(abs(float(value_rescale(torch.tensor(y), EPS)) - float(q[b, t, a[b, t]])))
        expected = ETA * max(deltas) + (1 - ETA) * np.mean(deltas)
        assert got[b, 0].item() == pytest.approx(expected, rel=1e-5)


def test_replay_gives_new_sequences_their_input_priorities(tmp_path):
    from functools import partial

    sampler = PrioritizedSampler(alpha=1.0, seed=0)
    replay = SequenceReplayBuffer(tmp_path / "rb", 4 * 48, batch_T=4, warmup_T=4, lookahead_T=N, rnn_state_interval=12,
                                  state_keys=[RECURRENT_KEYS[0]], sampler=sampler,
                                  input_priority=partial(input_priorities, gamma=GAMMA, n_step=N, eta=ETA))
    for i in range(3):
        batch = _batch(seed=i)
        batch[RECURRENT_KEYS[0]] = torch.zeros(4, 12, 1, H)
        replay.extend(batch)
        expected = input_priorities(batch, gamma=GAMMA, n_step=N, eta=ETA)[:, 0]
        assert "priority" not in batch.keys(), "the caller's batch must stay as it was"
        leaves = np.arange(4) * 4 + i  # stream b's i-th stored start
        np.testing.assert_allclose(sampler.priorities(leaves), expected.numpy(), rtol=1e-6)
