"""TwinQTD3Loss equals TorchRL's TD3Loss (same parameters, same random draws): losses and gradients, with n-step
discounts, time-limit bootstrapping and PER weights; target updates of actor and critics through TargetUpdate; bad
input."""

import pytest
import torch
from pendulum_samples import assert_time_limits_bootstrap, copy_critics_into_twin, pendulum_batch

from tdrl.models.q import make_deterministic_actor, make_q_critic, make_twin_q
from tdrl.objectives.continuous import make_td3_loss
from tdrl.objectives.reference import torchrl_td3_loss
from tdrl.objectives.td3 import TwinQTD3Loss
from tdrl.objectives.update import TargetUpdate

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")
GAMMA = 0.9
HIDDEN = (8, 8)


def _pair(specs):
    """TorchRL's TD3Loss and a TwinQTD3Loss sharing the actor, with equal critic and target params."""
    torch.manual_seed(0)
    actor = make_deterministic_actor(specs, hidden_sizes=HIDDEN)
    theirs = torchrl_td3_loss(actor, make_q_critic(specs, hidden_sizes=HIDDEN), specs.action_spec, gamma=GAMMA)
    space = specs.action_spec.space
    with torch.no_grad():
        for p in [*theirs.target_qvalue_network_params.values(True, True),
                  *theirs.target_actor_network_params.values(True, True)]:
            p.add_(0.3 * torch.randn_like(p))
    twin = make_twin_q(specs, hidden_sizes=HIDDEN, normalize_action=False)
    ours = TwinQTD3Loss(actor, twin, gamma=GAMMA, policy_noise=theirs.policy_noise, noise_clip=theirs.noise_clip,
                        action_low=space.low, action_high=space.high)
    copy_critics_into_twin(theirs.qvalue_network_params, ours.qvalue_network)
    copy_critics_into_twin(theirs.target_qvalue_network_params, ours.target_qvalue_network)
    theirs.target_actor_network_params["module"].to_module(ours.target_actor_net)
    return theirs, ours, actor


def _grads(params):
    return [p.grad.clone() for p in params]


@pytest.mark.parametrize("drop", [(), ("priority_weight",), ("steps_to_next_obs",)])
def test_losses_and_gradients_equal_torchrl(specs, drop):
    theirs, ours, actor = _pair(specs)
    batch = pendulum_batch().exclude(*drop)
    results = []
    for loss in (theirs, ours):
        for p in [*actor.parameters(), *loss.parameters()]:
            p.grad = None
        torch.manual_seed(7)
        out = loss(batch.clone())
        (out["loss_qvalue"] + out["loss_actor"]).backward()
        results.append((out, _grads(actor.parameters())))
    (out_theirs, g_theirs), (out_ours, g_ours) = results
    assert torch.allclose(out_theirs["loss_qvalue"], out_ours["loss_qvalue"], atol=1e-5)
    assert torch.allclose(out_theirs["loss_actor"], out_ours["loss_actor"], atol=1e-5)
    for a, b in zip(g_theirs, g_ours, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    w_theirs = theirs.qvalue_network_params["module", "net", "2", "weight"].grad.transpose(-1, -2)
    assert torch.allclose(w_theirs.reshape(ours.qvalue_network.weights[1].shape), ours.qvalue_network.weights[1].grad,
                          atol=1e-5)


def test_target_noise_is_smoothing_and_time_limits_bootstrap(specs):
    _, ours, _ = _pair(specs)
    batch = pendulum_batch()

    def q_loss(b, seed=3):
        torch.manual_seed(seed)
        return ours.value_loss(b)[0]

    assert not torch.allclose(q_loss(batch.clone()), q_loss(batch.clone(), seed=4))  # a different noise draw
    assert_time_limits_bootstrap(q_loss, batch)


def test_soft_target_update_moves_actor_and_critic_targets(specs):
    _, ours, actor = _pair(specs)
    target = TargetUpdate(ours, interval=1, tau=0.25)  # copies online -> target first (TorchRL's init)
    with torch.no_grad():
        for p in [*ours.qvalue_network.parameters(), *actor.parameters()]:
            p.add_(1.0)
    before = [t.clone() for t in (*ours.target_qvalue_network.parameters(), *ours.target_actor_net.parameters())]
    target.step()
    after = [*ours.target_qvalue_network.parameters(), *ours.target_actor_net.parameters()]
    online = [*ours.qvalue_network.parameters(), *actor.module.parameters()]
    for b, a, o in zip(before, after, online, strict=True):
        assert torch.allclose(a, 0.75 * b + 0.25 * o, atol=1e-6)
    trained = {n.split(".")[0] for n, p in ours.named_parameters() if p.requires_grad}
    assert trained == {"actor_network", "qvalue_network"}


def test_bad_input(specs):
    space = specs.action_spec.space
    actor = make_deterministic_actor(specs, hidden_sizes=HIDDEN)
    twin = make_twin_q(specs, hidden_sizes=HIDDEN)
    with pytest.raises(ValueError, match="TwinQ"):
        TwinQTD3Loss(actor, make_q_critic(specs), action_low=space.low, action_high=space.high)
    with pytest.raises(ValueError, match="gamma"):
        TwinQTD3Loss(actor, twin, action_low=space.low, action_high=space.high, gamma=1.5)


def test_the_factory_gives_the_twin_q_loss_with_noise_relative_to_the_box(specs):
    actor = make_deterministic_actor(specs, hidden_sizes=HIDDEN)
    td3 = make_td3_loss(actor, make_twin_q(specs, hidden_sizes=HIDDEN), specs.action_spec)
    assert isinstance(td3, TwinQTD3Loss)
    assert td3.policy_noise == pytest.approx(0.4) and td3.noise_clip == pytest.approx(1.0)  # relative to [-2, 2]
