"""DQN / C51 loss wiring: each configured loss equals the loss computed by hand on a tiny batch (n-step discount,
terminated vs truncated, double DQN, IS weights), priorities in rlpyt's units, target update cadence."""

import pytest
import torch
from tensordict import TensorDict

from tdrl.envs.make import EnvFactory
from tdrl.models.q import make_q_actor
from tdrl.objectives.dqn import DirectDQNLoss, dqn_priorities, make_dqn_loss
from tdrl.objectives.reference import torchrl_dqn_loss
from tdrl.objectives.update import TargetUpdate, Updater

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")
GAMMA = 0.9


@pytest.fixture(scope="module")
def specs():  # overrides conftest's Pendulum specs: DQN needs discrete actions
    return EnvFactory("CartPole-v1").specs()


def _batch():
    """Five transitions: plain, terminal, time-limit truncation (bootstraps), and two n-step windows."""
    torch.manual_seed(1)
    n = 5
    return TensorDict(
        {
            "observation": torch.randn(n, 4),
            "action": torch.tensor([0, 1, 1, 0, 1]),
            ("next", "observation"): torch.randn(n, 4),
            ("next", "reward"): torch.tensor([[1.0], [0.5], [-1.0], [2.0], [0.0]]),
            ("next", "terminated"): torch.tensor([[False], [True], [False], [False], [True]]),
            ("next", "truncated"): torch.tensor([[False], [False], [True], [False], [False]]),
            ("next", "done"): torch.tensor([[False], [True], [True], [False], [True]]),
            "steps_to_next_obs": torch.tensor([[1], [1], [1], [3], [2]]),
            "priority_weight": torch.tensor([1.0, 0.5, 0.25, 0.8, 0.3]),
        },
        batch_size=[n],
    )


def _perturb_target(loss):
    targets = loss.target_q_net.parameters() if isinstance(loss, DirectDQNLoss) else \
        loss.target_value_network_params.values(True, True)
    with torch.no_grad():
        for p in targets:
            p.add_(0.3 * torch.randn_like(p))


def _q(loss, obs, target=False):
    if isinstance(loss, DirectDQNLoss):
        with torch.no_grad():
            return (loss.target_q_net if target else loss.q_net)(obs)
    params = loss.target_value_network_params if target else loss.value_network_params
    with torch.no_grad(), params.to_module(loss.value_network):
        return loss.value_network(TensorDict(observation=obs, batch_size=obs.shape[:1]))["action_value"]


@pytest.mark.parametrize("double", [False, True])
@pytest.mark.parametrize("loss_function", ["huber", "mse"])
def test_dqn_loss_equals_hand_computed(specs, double, loss_function):
    torch.manual_seed(0)
    actor = make_q_actor(specs, hidden_sizes=(8,), dueling=True)
    loss = make_dqn_loss(actor, gamma=GAMMA, double_dqn=double, loss_function=loss_function)
    _perturb_target(loss)
    batch = _batch()
    out = loss(batch)["loss"]

    q_sa = _q(loss, batch["observation"]).gather(-1, batch["action"][:, None]).squeeze(-1)
    next_obs = batch["next", "observation"]
    q_next_target = _q(loss, next_obs, target=True)
    if double:
        a_star = _q(loss, next_obs).argmax(-1, keepdim=True)
        bootstrap = q_next_target.gather(-1, a_star).squeeze(-1)
    else:
        bootstrap = q_next_target.max(-1).values
    not_term = (~batch["next", "terminated"]).float().squeeze(-1)
    discount = GAMMA ** batch["steps_to_next_obs"].squeeze(-1).float()
    y = batch["next", "reward"].squeeze(-1) + discount * not_term * bootstrap
    delta = q_sa - y
    huber = torch.where(delta.abs() < 1, 0.5 * delta**2, delta.abs() - 0.5)
    per_sample = huber if loss_function == "huber" else delta**2
    w = batch["priority_weight"]
    expected = (w * per_sample).sum() / w.sum()
    assert torch.allclose(out, expected, atol=1e-6), (out, expected)

    priorities = dqn_priorities(batch, categorical=False, delta_clip=1.0)
    assert torch.allclose(priorities, delta.abs().clamp(max=1.0), atol=1e-5)
    assert torch.allclose(dqn_priorities(batch, categorical=False, delta_clip=None), delta.abs(), atol=1e-5)


def _project(p_next, reward, discount, not_term, support):
    """Reference C51 projection, one sample and one atom at a time."""
    v_min, v_max, n = float(support[0]), float(support[-1]), support.numel()
    dz = (v_max - v_min) / (n - 1)
    m = torch.zeros(n)
    for j in range(n):
        tz = min(max(reward + discount * not_term * float(support[j]), v_min), v_max)
        b = (tz - v_min) / dz
        lo, hi = int(torch.floor(torch.tensor(b))), int(torch.ceil(torch.tensor(b)))
        if lo == hi:
            m[lo] += p_next[j]
        else:
            m[lo] += p_next[j] * (hi - b)
            m[hi] += p_next[j] * (b - lo)
    return m


@pytest.mark.parametrize("dueling", [False, True])
def test_categorical_loss_equals_hand_computed(specs, dueling):
    torch.manual_seed(0)
    actor = make_q_actor(specs, hidden_sizes=(8,), dueling=dueling, n_atoms=7, v_min=-3.0, v_max=3.0)
    loss = make_dqn_loss(actor, gamma=GAMMA, double_dqn=True)
    _perturb_target(loss)
    batch = _batch()
    out = loss(batch)["loss"]

    support = torch.linspace(-3.0, 3.0, 7)
    logp = _q(loss, batch["observation"])  # [n, atoms, actions]
    logp_sa = logp[torch.arange(5), :, batch["action"]]
    next_obs = batch["next", "observation"]
    q_next_online = (_q(loss, next_obs).exp() * support[:, None]).sum(-2)
    a_star = q_next_online.argmax(-1)
    p_next = _q(loss, next_obs, target=True).exp()[torch.arange(5), :, a_star]
    per_sample = []
    for i in range(5):
        m = _project(
            p_next[i],
            float(batch["next", "reward"][i]),
            GAMMA ** float(batch["steps_to_next_obs"][i]),
            0.0 if bool(batch["next", "terminated"][i]) else 1.0,
            support,
        )
        per_sample.append(-(m * logp_sa[i]).sum())
    per_sample = torch.stack(per_sample)
    w = batch["priority_weight"]
    expected = (w * per_sample).sum() / w.sum()
    assert torch.allclose(out, expected, atol=1e-5), (out, expected)
    assert torch.allclose(dqn_priorities(batch, categorical=True), per_sample, atol=1e-5)


def test_unweighted_without_weight_key(specs):
    torch.manual_seed(0)
    loss = make_dqn_loss(make_q_actor(specs, hidden_sizes=(8,)), gamma=GAMMA)
    batch = _batch()
    weighted = loss(batch.clone())["loss"]
    unweighted = loss(batch.exclude("priority_weight"))["loss"]
    assert not torch.allclose(weighted, unweighted)
    loss_none = make_dqn_loss(make_q_actor(specs, hidden_sizes=(8,)), gamma=GAMMA)
    loss_none.load_state_dict(loss.state_dict())
    loss_none.reduction = "none"
    assert torch.allclose(unweighted, loss_none(batch.exclude("priority_weight"))["loss"].mean())


def test_target_update_counts_gradient_updates(specs):
    torch.manual_seed(0)
    loss = make_dqn_loss(make_q_actor(specs, hidden_sizes=(8,)), gamma=GAMMA)
    updater = Updater(torch.optim.SGD(loss.q_net.parameters(), lr=0.1), loss_keys=("loss",),
                      target_update=TargetUpdate(loss, interval=3))
    target0 = TensorDict.from_module(loss.target_q_net).clone()
    batch = _batch()
    for k in range(1, 7):
        updater.step(loss(batch.clone()))
        online, target = TensorDict.from_module(loss.q_net), TensorDict.from_module(loss.target_q_net)
        if k % 3 == 0:
            assert (online == target).all(), k
            target0 = target.clone()
        else:
            assert (target == target0).all(), k
            assert not (online == target).all(), k


def test_bad_settings(specs):
    with pytest.raises(ValueError, match="double_dqn=True"):
        make_dqn_loss(make_q_actor(specs, n_atoms=11), double_dqn=False)
    with pytest.raises(ValueError, match="loss_function"):
        make_dqn_loss(make_q_actor(specs), loss_function="l1")
    with pytest.raises(ValueError, match="gamma"):
        make_dqn_loss(make_q_actor(specs), gamma=1.5)
    with pytest.raises(KeyError, match="td_error"):
        dqn_priorities(_batch(), categorical=False)


# --- replay plumbing: tdrl.replay samples feed the loss ----------------------------------------------------------


def _episode_batch(T=12):
    """One env, T steps of CartPole-shaped data: rewards t+1, termination after step 4, a time limit after step 8."""
    torch.manual_seed(2)
    obs = torch.randn(1, T + 1, 4)
    term = torch.zeros(1, T, 1, dtype=torch.bool)
    trunc = torch.zeros(1, T, 1, dtype=torch.bool)
    term[0, 4] = True
    trunc[0, 8] = True
    return TensorDict(
        {
            "observation": obs[:, :-1],
            "action": torch.randint(2, (1, T)),
            ("next", "observation"): obs[:, 1:],
            ("next", "reward"): torch.arange(1.0, T + 1).view(1, T, 1),
            ("next", "terminated"): term,
            ("next", "truncated"): trunc,
            ("next", "done"): term | trunc,
        },
        batch_size=[1, T],
    )


def test_nstep_replay_sample_gives_the_nstep_target(specs, tmp_path):
    from tdrl.replay import TransitionReplayBuffer

    n, batch = 3, _episode_batch()
    replay = TransitionReplayBuffer(tmp_path / "replay", 100, n_step=n, gamma=GAMMA, seed=0)
    replay.extend(batch)
    torch.manual_seed(0)
    loss = make_dqn_loss(make_q_actor(specs, hidden_sizes=(8,)), gamma=GAMMA, double_dqn=False, loss_function="mse")
    _perturb_target(loss)
    sample = replay.sample(10)  # the 10 starts whose 3-step window is complete (drawn with replacement)
    out = loss(sample)["loss"]

    # the n-step target rebuilt from the raw episode: sum of discounted rewards up to the first done or n steps,
    # bootstrapped from the observation after the window unless the window ended in a termination
    nxt = batch["next"][0]
    r, term, done = nxt["reward"][:, 0], nxt["terminated"][:, 0], nxt["done"][:, 0]
    targets = []
    for t in sample["index"].tolist():  # one stream: the flat index is the time step
        g, k = 0.0, 0
        while k < n:
            g += GAMMA**k * float(r[t + k])
            k += 1
            if done[t + k - 1]:
                break
        last = t + k - 1
        q_next = _q(loss, batch["next", "observation"][0, last][None], target=True).max(-1).values
        targets.append(g + (0.0 if term[last] else GAMMA**k * float(q_next)))
        assert int(sample["steps_to_next_obs"][len(targets) - 1]) == k
    q_sa = _q(loss, sample["observation"]).gather(-1, sample["action"][:, None]).squeeze(-1)
    expected = ((q_sa - torch.tensor(targets)) ** 2).mean()
    assert torch.allclose(out, expected, atol=1e-5), (out, expected)


def test_prioritized_replay_weights_and_priorities_round_trip(specs, tmp_path):
    from tdrl.replay import PrioritizedSampler, TransitionReplayBuffer

    sampler = PrioritizedSampler(alpha=0.6, beta_init=0.4, seed=0)
    replay = TransitionReplayBuffer(tmp_path / "replay", 100, sampler=sampler, n_step=1, gamma=GAMMA, seed=0)
    replay.extend(_episode_batch())
    torch.manual_seed(0)
    loss = make_dqn_loss(make_q_actor(specs, hidden_sizes=(8,)), gamma=GAMMA)
    sample = replay.sample(8)
    sample["priority_weight"] = torch.linspace(0.2, 1.0, 8)  # distinct weights: the loss must use them
    weighted = loss(sample)["loss"]
    priorities = dqn_priorities(sample, categorical=False, delta_clip=1.0)
    delta = sample["td_error"].squeeze(-1).sqrt()
    huber = torch.where(delta < 1, 0.5 * delta**2, delta - 0.5)
    w = torch.linspace(0.2, 1.0, 8)
    assert torch.allclose(weighted, (w * huber).sum() / w.sum(), atol=1e-5)
    replay.update_priority(sample["index"], priorities)
    stored = torch.as_tensor(sampler.priorities(sample["index"].numpy()), dtype=torch.float32)
    assert torch.allclose(stored, delta.clamp(max=1.0), atol=1e-6)


@pytest.mark.parametrize("double", [False, True])
@pytest.mark.parametrize("loss_function", ["huber", "mse"])
def test_direct_dqn_loss_equals_torchrl_values_gradients_and_td_error(specs, double, loss_function):
    torch.manual_seed(0)
    actor = make_q_actor(specs, hidden_sizes=(16,), dueling=True)
    fused = make_dqn_loss(actor, gamma=GAMMA, double_dqn=double, loss_function=loss_function)
    reference = torchrl_dqn_loss(actor, gamma=GAMMA, double_dqn=double, loss_function=loss_function)
    assert isinstance(fused, DirectDQNLoss)
    _perturb_target(fused)
    with torch.no_grad():
        reference.target_value_network_params["module", "0", "module"].update_(
            TensorDict.from_module(fused.target_q_net))
    out = {}
    for name, loss in (("fused", fused), ("torchrl", reference)):
        batch = _batch()
        actor.zero_grad(set_to_none=True)
        value = loss(batch)["loss"]
        value.backward()
        out[name] = (value.detach(), [p.grad.clone() for p in actor.parameters()], batch["td_error"])
    assert torch.allclose(out["fused"][0], out["torchrl"][0], atol=1e-6)
    for g_fused, g_ref in zip(out["fused"][1], out["torchrl"][1], strict=True):
        assert torch.allclose(g_fused, g_ref, atol=1e-6)
    assert torch.allclose(out["fused"][2].reshape(-1), out["torchrl"][2].reshape(-1), atol=1e-6)
