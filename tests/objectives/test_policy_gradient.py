"""PPOLoss equals TorchRL's ClipPPOLoss (values and gradients) on feed-forward models, the conv actor-critic's shared
torso included; recurrent PPO and every A2C get TorchRL's losses."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical
from torchrl.objectives import A2CLoss, ClipPPOLoss

from tdrl.envs import EnvFactory
from tdrl.envs.make import EnvSpecs
from tdrl.models import make_actor_critic, make_recurrent_actor_critic
from tdrl.objectives.policy_gradient import PPOLoss, make_a2c_loss, make_ppo_loss
from tdrl.objectives.reference import torchrl_ppo_loss


def _minibatch(ac, obs_size, n=64):
    torch.manual_seed(1)
    td = TensorDict({"observation": torch.randn(n, obs_size)}, [n])
    with torch.no_grad():
        ac.actor(td)
        # stale behaviour log-probs so ratios differ from 1 and the clip is active for some samples
        td["action_log_prob"] = td["action_log_prob"] + 0.3 * torch.randn(n)
    td["advantage"] = torch.randn(n, 1)
    td["value_target"] = torch.randn(n, 1)
    return td


def _grads(model, loss_td, keys):
    model.zero_grad()
    sum(loss_td[k] for k in keys).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("env_id,dist", [("CartPole-v1", "auto"), ("Pendulum-v1", "normal")])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("entropy_coeff", [0.01, 0.0])  # 0: the entropy is a metric, kept out of the graph
def test_ppo_equals_torchrl_clip_ppo(env_id, dist, normalize, entropy_coeff):
    specs = EnvFactory(env_id).specs()
    torch.manual_seed(0)
    ac = make_actor_critic(specs, distribution=dist)
    td = _minibatch(ac, specs.observation_spec.shape[0])
    kw = dict(critic_coeff=0.5, entropy_coeff=entropy_coeff, normalize_advantage=normalize)
    ours = PPOLoss(ac, clip_epsilon=0.2, **kw)(td.clone())
    theirs = torchrl_ppo_loss(ac, clip_epsilon=0.2, **kw)(td.clone())
    for key in ("loss_objective", "loss_critic", "loss_entropy", "entropy", "clip_fraction", "kl_approx"):
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-6, msg=key)
    assert 0 < ours["clip_fraction"] < 1
    keys = ("loss_objective", "loss_critic", "loss_entropy")
    g_ours = _grads(ac, PPOLoss(ac, clip_epsilon=0.2, **kw)(td.clone()), keys)
    g_theirs = _grads(ac, torchrl_ppo_loss(ac, clip_epsilon=0.2, **kw)(td.clone()), keys)
    assert g_ours.keys() == g_theirs.keys()
    for name in g_ours:
        torch.testing.assert_close(g_ours[name], g_theirs[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("loss_kind", ["ppo", "a2c"])
def test_conv_actor_critic_losses_equal_separate_heads(loss_kind):
    """Image observations: PPOLoss runs the shared torso once (distribution_and_value) and equals TorchRL's
    ClipPPOLoss, which calls actor and critic apart; TorchRL's A2CLoss trains the shared torso from both terms."""
    specs = EnvSpecs(Bounded(0, 255, shape=(4, 36, 36), dtype=torch.uint8), Categorical(4))
    torch.manual_seed(0)
    ac = make_actor_critic(specs)
    n = 32
    td = TensorDict({"observation": torch.randint(0, 256, (n, 4, 36, 36), dtype=torch.uint8)}, [n])
    with torch.no_grad():
        ac.actor(td)
    td["action_log_prob"] = td["action_log_prob"] + 0.3 * torch.randn(n)
    td["advantage"], td["value_target"] = torch.randn(n, 1), torch.randn(n, 1)
    keys = ("loss_objective", "loss_critic", "loss_entropy")
    if loss_kind == "ppo":
        kw = dict(critic_coeff=0.5, entropy_coeff=0.01, normalize_advantage=True)
        ours, theirs = PPOLoss(ac, clip_epsilon=0.2, **kw), torchrl_ppo_loss(ac, clip_epsilon=0.2, **kw)
    else:  # the A2C and IMPALA recipes' loss against the same terms written out on the joint call
        theirs = make_a2c_loss(ac, critic_coeff=0.5, entropy_coeff=0.01)

        def ours(data):
            dist, value = ac.distribution_and_value(data["observation"])
            return {"loss_objective": -(dist.log_prob(data["action"]) * data["advantage"].squeeze(-1)).mean(),
                    "loss_critic": 0.5 * (value - data["value_target"]).pow(2).mean(),
                    "loss_entropy": -0.01 * dist.entropy().mean()}
    g_ours, g_theirs = _grads(ac, ours(td.clone()), keys), _grads(ac, theirs(td.clone()), keys)
    assert g_ours.keys() == g_theirs.keys() and any("conv" in name for name in g_ours)
    for name in g_ours:
        torch.testing.assert_close(g_ours[name], g_theirs[name], rtol=1e-4, atol=1e-6, msg=name)


def test_clip_schedule_buffer_changes_the_objective():
    specs = EnvFactory("CartPole-v1").specs()
    ac = make_actor_critic(specs)
    td = _minibatch(ac, 4)
    loss = make_ppo_loss(ac, clip_epsilon=0.2, critic_coeff=0.5, entropy_coeff=0.0, normalize_advantage=True)
    wide = loss(td.clone())["clip_fraction"]
    loss.clip_epsilon.fill_(0.01)  # what the recipe's linear decay does
    assert loss(td.clone())["clip_fraction"] > wide


def test_tanh_normal_entropy_is_estimated():
    specs = EnvFactory("Pendulum-v1").specs()
    ac = make_actor_critic(specs, distribution="tanh_normal")
    out = PPOLoss(ac, clip_epsilon=0.2, critic_coeff=0.5, entropy_coeff=0.01)(_minibatch(ac, 3))
    assert torch.isfinite(out["entropy"]) and out["loss_entropy"].requires_grad
    metric_only = PPOLoss(ac, clip_epsilon=0.2, critic_coeff=0.5, entropy_coeff=0.0)(_minibatch(ac, 3))
    assert torch.isfinite(metric_only["entropy"]) and not metric_only["loss_entropy"].requires_grad


def test_factories_use_torchrl_losses_for_recurrent_models():
    specs = EnvFactory("CartPole-v1").specs()
    rec = make_recurrent_actor_critic(specs, hidden_sizes=(8,), lstm_size=4)
    assert isinstance(make_ppo_loss(rec, clip_epsilon=0.2, critic_coeff=0.5, entropy_coeff=0.0,
                                    normalize_advantage=True), ClipPPOLoss)
    assert isinstance(make_a2c_loss(rec, critic_coeff=0.5, entropy_coeff=0.0), A2CLoss)
    assert isinstance(make_ppo_loss(make_actor_critic(specs), clip_epsilon=0.2, critic_coeff=0.5, entropy_coeff=0.0,
                                    normalize_advantage=True), PPOLoss)
    assert isinstance(make_a2c_loss(make_actor_critic(specs), critic_coeff=0.5, entropy_coeff=0.0), A2CLoss)
    with pytest.raises(ValueError, match="feed-forward"):
        PPOLoss(rec, clip_epsilon=0.2, critic_coeff=0.5, entropy_coeff=0.0)
