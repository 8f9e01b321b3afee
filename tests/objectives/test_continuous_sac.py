"""TwinQSACLoss equals TorchRL's SACLoss (same parameters, same random draws): losses and gradients, with n-step
discounts, time-limit bootstrapping and PER weights; target updates through TorchRL's SoftUpdate; bad input."""

import pytest
import torch
from pendulum_samples import assert_time_limits_bootstrap, copy_critics_into_twin, pendulum_batch
from tensordict.nn import NormalParamExtractor

from tdrl.models.q import (
    make_deterministic_actor,
    make_q_critic,
    make_tanh_gaussian_actor,
    make_twin_q,
)
from tdrl.objectives.reference import torchrl_sac_loss
from tdrl.objectives.sac import TwinQSACLoss
from tdrl.objectives.update import TargetUpdate

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")
GAMMA = 0.9
HIDDEN = (8, 8)


def _pair(specs, alpha_init=0.7, scale_mapping="log_std"):
    """TorchRL's SACLoss and a TwinQSACLoss sharing the actor, with the same critic and target parameters."""
    torch.manual_seed(0)
    actor = make_tanh_gaussian_actor(specs, hidden_sizes=HIDDEN)
    if scale_mapping == "softplus":  # a network TwinQSACLoss calls whole (no LogStdGaussianParams to read log-std)
        actor.net[-1] = NormalParamExtractor(scale_mapping="biased_softplus_1.0", scale_lb=1e-4)
    theirs = torchrl_sac_loss(actor, make_q_critic(specs, hidden_sizes=HIDDEN), specs.action_spec, gamma=GAMMA,
                           alpha_init=alpha_init)
    with torch.no_grad():
        for p in theirs.target_qvalue_network_params.values(True, True):
            p.add_(0.3 * torch.randn_like(p))
    ours = TwinQSACLoss(actor, make_twin_q(specs, hidden_sizes=HIDDEN, normalize_action=False), gamma=GAMMA,
                        alpha_init=alpha_init)
    copy_critics_into_twin(theirs.qvalue_network_params, ours.qvalue_network)
    copy_critics_into_twin(theirs.target_qvalue_network_params, ours.target_qvalue_network)
    return theirs, ours, actor


@pytest.mark.parametrize("scale_mapping", ["log_std", "softplus"])  # log-std read before its exp / network called
@pytest.mark.parametrize("drop", [(), ("priority_weight",), ("steps_to_next_obs",)])
def test_losses_and_gradients_equal_torchrl(specs, drop, scale_mapping):
    theirs, ours, actor = _pair(specs, scale_mapping=scale_mapping)
    batch = pendulum_batch().exclude(*drop)
    torch.manual_seed(7)
    out_theirs = theirs(batch.clone())
    torch.manual_seed(7)
    out_ours = ours(batch.clone())
    for key in ("loss_qvalue", "loss_actor", "loss_alpha", "alpha", "entropy"):
        assert torch.allclose(out_theirs[key], out_ours[key], atol=1e-5, rtol=1e-5), key

    def grads(loss, out):
        """Gradients of the summed losses: the shared actor's, log_alpha's, and the middle critic layer's."""
        for p in [*actor.parameters(), *loss.parameters()]:
            p.grad = None
        (out["loss_qvalue"] + out["loss_actor"] + out["loss_alpha"]).backward()
        return [p.grad.clone() for p in actor.parameters()] + [loss.log_alpha.grad.clone()]

    g_theirs = grads(theirs, out_theirs)
    w_theirs = theirs.qvalue_network_params["module", "net", "2", "weight"].grad.transpose(-1, -2)
    g_ours = grads(ours, out_ours)
    assert len(g_theirs) == len(g_ours) > 1
    for a, b in zip(g_theirs, g_ours, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert torch.allclose(w_theirs, ours.qvalue_network.weights[1].grad, atol=1e-5)


def test_nstep_and_time_limits_reach_the_target(specs):
    """Changing steps_to_next_obs or terminated changes loss_qvalue; truncated alone does not stop the bootstrap."""
    _, ours, _ = _pair(specs)
    batch = pendulum_batch()

    def q_loss(b):
        torch.manual_seed(3)
        return ours(b)["loss_qvalue"]

    more_steps = batch.clone()
    more_steps["steps_to_next_obs"][0] = 5
    assert not torch.allclose(q_loss(batch.clone()), q_loss(more_steps))
    assert_time_limits_bootstrap(q_loss, batch)


def test_soft_target_update_and_parameter_groups(specs):
    _, ours, _ = _pair(specs)
    target = TargetUpdate(ours, interval=1, tau=0.25)
    with torch.no_grad():
        for p in ours.qvalue_network.parameters():
            p.add_(1.0)
    before = [p.clone() for p in ours.target_qvalue_network.parameters()]
    target.step()
    for b, online, after in zip(before, ours.qvalue_network.parameters(), ours.target_qvalue_network.parameters(),
                                strict=True):
        assert torch.allclose(after, 0.75 * b + 0.25 * online, atol=1e-6) and not torch.equal(after, b)
    names = {n.split(".")[0] for n, p in ours.named_parameters() if p.requires_grad}
    assert names == {"log_alpha", "actor_network", "qvalue_network"}  # targets are not trained


def test_fixed_alpha_and_target_entropy(specs):
    loss = TwinQSACLoss(make_tanh_gaussian_actor(specs, hidden_sizes=HIDDEN), make_twin_q(specs, hidden_sizes=HIDDEN),
                        alpha_init=0.2, fixed_alpha=True, target_entropy=-3.0)
    assert "log_alpha" not in dict(loss.named_parameters()) and float(loss.target_entropy) == -3.0
    assert torch.allclose(loss(pendulum_batch())["alpha"], torch.tensor(0.2))


def test_bad_input(specs):
    with pytest.raises(ValueError, match="TanhNormal"):
        TwinQSACLoss(make_deterministic_actor(specs), make_twin_q(specs))
    with pytest.raises(ValueError, match="TwinQ"):
        TwinQSACLoss(make_tanh_gaussian_actor(specs), make_q_critic(specs))
    with pytest.raises(ValueError, match="gamma"):
        TwinQSACLoss(make_tanh_gaussian_actor(specs), make_twin_q(specs), gamma=2.0)


def test_critic_and_actor_losses_reach_their_own_parameters(specs):
    _, ours, actor = _pair(specs)
    critic = list(ours.qvalue_network.parameters())
    policy = [*actor.parameters(), ours.log_alpha]
    for method, own, other in ((ours.critic_loss, critic, policy), (ours.actor_loss, policy, critic)):
        out = method(pendulum_batch())
        total = sum(v for k, v in out.items() if k.startswith("loss_"))
        grads = torch.autograd.grad(total, own + other, allow_unused=True)
        assert all(g is not None and g.abs().sum() > 0 for g in grads[: len(own)]), method.__name__
        assert all(g is None or g.abs().sum() == 0 for g in grads[len(own):]), method.__name__


def test_twin_q_reads_actions_rescaled_to_unit_box(specs):
    torch.manual_seed(0)
    scaled = make_twin_q(specs, hidden_sizes=HIDDEN)  # Pendulum: actions in [-2, 2]
    raw = make_twin_q(specs, hidden_sizes=HIDDEN, normalize_action=False)
    raw.load_state_dict({k: v for k, v in scaled.state_dict().items() if not k.startswith("action_")}, strict=False)
    obs, action = torch.randn(5, 3), torch.rand(5, 1) * 4 - 2
    assert torch.allclose(scaled(obs, action), raw(obs, action / 2))
