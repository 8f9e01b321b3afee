"""DDPG / TD3 / SAC loss wiring of the TorchRL oracles (tdrl.objectives.reference): they equal hand-computed ones
on a tiny batch (n-step discount,
time-limit bootstrapping, IS weights), TD3 noise units, SAC's entropy target, ``timeouts_as_terminal``."""

import pytest
import torch
from tensordict import TensorDict
from torchrl.modules.distributions.utils import rsample_and_log_prob

from tdrl.models.q import make_deterministic_actor, make_q_critic, make_tanh_gaussian_actor
from tdrl.objectives.continuous import make_ddpg_loss, timeouts_as_terminal
from tdrl.objectives.reference import torchrl_sac_loss, torchrl_td3_loss

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")
GAMMA = 0.9


def _batch():
    """Four transitions: plain, terminal, time-limit truncation (bootstraps), a 3-step window."""
    torch.manual_seed(1)
    n = 4
    return TensorDict(
        {
            "observation": torch.randn(n, 3),
            "action": torch.rand(n, 1) * 4 - 2,
            ("next", "observation"): torch.randn(n, 3),
            ("next", "reward"): torch.tensor([[-1.0], [-0.5], [-2.0], [-3.0]]),
            ("next", "terminated"): torch.tensor([[False], [True], [False], [False]]),
            ("next", "truncated"): torch.tensor([[False], [False], [True], [False]]),
            ("next", "done"): torch.tensor([[False], [True], [True], [False]]),
            "steps_to_next_obs": torch.tensor([[1], [1], [1], [3]]),
            "priority_weight": torch.tensor([1.0, 0.5, 0.25, 0.8]),
        },
        batch_size=[n],
    )


def _perturb(params):
    with torch.no_grad():
        for p in params.values(True, True):
            p.add_(0.3 * torch.randn_like(p))


def _run(module, params, td):
    with torch.no_grad(), params.to_module(module):
        return module(td.clone())


def _discount_mask(batch, terminal_key=("next", "terminated")):
    not_term = (~batch[terminal_key]).float()
    return GAMMA ** batch["steps_to_next_obs"].float() * not_term  # [n, 1]


def _weighted_mean(per_sample, w):
    return (w * per_sample).sum() / w.sum()


@pytest.mark.parametrize("timeouts_terminal", [False, True])
def test_ddpg_losses_equal_hand_computed(specs, timeouts_terminal):
    torch.manual_seed(0)
    loss = make_ddpg_loss(make_deterministic_actor(specs, hidden_sizes=(8,)),
                             make_q_critic(specs, hidden_sizes=(8,)), gamma=GAMMA)
    _perturb(loss.target_actor_network_params)
    _perturb(loss.target_value_network_params)
    batch = _batch()
    if timeouts_terminal:
        timeouts_as_terminal(batch)
    out = loss(batch.clone())

    nxt = TensorDict(observation=batch["next", "observation"], batch_size=[4])
    next_action = _run(loss.actor_network, loss.target_actor_network_params, nxt)["action"]
    q_next = _run(loss.value_network, loss.target_value_network_params, nxt.set("action", next_action))
    y = batch["next", "reward"] + _discount_mask(batch) * q_next["state_action_value"]
    q = _run(loss.value_network, loss.value_network_params, batch.select("observation", "action"))
    w = batch["priority_weight"]
    expected_value = _weighted_mean(((q["state_action_value"] - y) ** 2).squeeze(-1), w)
    assert torch.allclose(out["loss_value"], expected_value, atol=1e-5)

    obs = batch.select("observation")
    mu = _run(loss.actor_network, loss.actor_network_params, obs)["action"]
    q_mu = _run(loss.value_network, loss.value_network_params, obs.set("action", mu))["state_action_value"]
    assert torch.allclose(out["loss_actor"], _weighted_mean(-q_mu.squeeze(-1), w), atol=1e-5)
    if timeouts_terminal:  # the truncated transition no longer bootstraps
        assert bool(batch["next", "terminated"][2])


def test_td3_critic_loss_equals_hand_computed_and_noise_units(specs):
    torch.manual_seed(0)
    loss = torchrl_td3_loss(make_deterministic_actor(specs, hidden_sizes=(8,)), make_q_critic(specs, hidden_sizes=(8,)),
                         specs.action_spec, gamma=GAMMA, target_noise=0.0, target_noise_clip=0.0)
    _perturb(loss.target_actor_network_params)
    _perturb(loss.target_qvalue_network_params)
    batch = _batch()
    loss_q, _ = loss.value_loss(batch.clone())

    nxt = TensorDict(observation=batch["next", "observation"], batch_size=[4])
    next_action = _run(loss.actor_network, loss.target_actor_network_params, nxt)["action"]
    nxt.set("action", next_action)
    q_next = torch.stack(
        [_run(loss.qvalue_network, loss.target_qvalue_network_params[i], nxt)["state_action_value"] for i in range(2)]
    ).min(0).values
    y = batch["next", "reward"] + _discount_mask(batch) * q_next
    sa = batch.select("observation", "action")
    per_sample = sum(
        (_run(loss.qvalue_network, loss.qvalue_network_params[i], sa)["state_action_value"] - y) ** 2 for i in range(2)
    ).squeeze(-1)
    assert torch.allclose(loss_q, _weighted_mean(per_sample, batch["priority_weight"]), atol=1e-5)

    # relative noise: 0.2 / 0.5 of the half-width of Pendulum's [-2, 2] box
    scaled = torchrl_td3_loss(make_deterministic_actor(specs), make_q_critic(specs), specs.action_spec)
    assert scaled.policy_noise == pytest.approx(0.4) and scaled.noise_clip == pytest.approx(1.0)


def test_sac_critic_loss_equals_hand_computed(specs):
    torch.manual_seed(0)
    loss = torchrl_sac_loss(make_tanh_gaussian_actor(specs, hidden_sizes=(8,)), make_q_critic(specs, hidden_sizes=(8,)),
                         specs.action_spec, gamma=GAMMA, alpha_init=0.7)
    _perturb(loss.target_qvalue_network_params)
    batch = _batch()
    torch.manual_seed(123)
    loss_q, _ = loss.qvalue_v2_loss(batch.clone())

    torch.manual_seed(123)
    nxt = TensorDict(observation=batch["next", "observation"], batch_size=[4])
    with torch.no_grad(), loss.actor_network_params.to_module(loss.actor_network):
        next_action, next_log_prob = rsample_and_log_prob(loss.actor_network.get_dist(nxt.clone()))
    nxt.set("action", next_action)
    q_next = torch.stack(
        [_run(loss.qvalue_network, loss.target_qvalue_network_params[i], nxt)["state_action_value"] for i in range(2)]
    ).min(0).values
    alpha = 0.7
    y = batch["next", "reward"] + _discount_mask(batch) * (q_next - alpha * next_log_prob.reshape(4, 1))
    sa = batch.select("observation", "action")
    per_sample = sum(
        (_run(loss.qvalue_network, loss.qvalue_network_params[i], sa)["state_action_value"] - y) ** 2 for i in range(2)
    ).squeeze(-1)
    assert torch.allclose(loss_q, _weighted_mean(per_sample, batch["priority_weight"]), atol=1e-4)
    assert float(loss.target_entropy) == -1.0  # "auto": -action_dim


def test_sac_losses_train_separable_parameter_sets(specs):
    """loss_actor reaches only the actor, loss_qvalue only the critics, loss_alpha only log_alpha: one optimizer
    over their sum is the same as three optimizers."""
    loss = torchrl_sac_loss(make_tanh_gaussian_actor(specs, hidden_sizes=(8,)), make_q_critic(specs, hidden_sizes=(8,)),
                         specs.action_spec)
    groups = {
        "loss_actor": list(loss.actor_network_params.values(True, True)),
        "loss_qvalue": list(loss.qvalue_network_params.values(True, True)),
        "loss_alpha": [loss.log_alpha],
    }
    out = loss(_batch())
    for key, own in groups.items():
        others = [p for k, ps in groups.items() if k != key for p in ps]
        grads = torch.autograd.grad(out[key], own + others, allow_unused=True, retain_graph=True)
        assert any(g is not None and g.abs().sum() > 0 for g in grads[: len(own)]), key
        assert all(g is None or g.abs().sum() == 0 for g in grads[len(own):]), key


def test_relative_noise_needs_one_scale():
    from torchrl.data import Bounded

    spec = Bounded(torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 2.0]), shape=(2,))
    from tdrl.envs.make import EnvSpecs

    specs = EnvSpecs(observation_spec=Bounded(-1.0, 1.0, shape=(3,)), action_spec=spec)
    with pytest.raises(ValueError, match="half-widths differ"):
        torchrl_td3_loss(make_deterministic_actor(specs), make_q_critic(specs), spec)


def test_bad_loss_settings(specs):
    with pytest.raises(ValueError, match="gamma"):
        torchrl_sac_loss(make_tanh_gaussian_actor(specs), make_q_critic(specs), specs.action_spec, gamma=-0.1)
