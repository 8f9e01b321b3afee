"""Updater: a step equals a hand-computed SGD step; NaN losses/gradients stop before parameters change;
target updates are counted in gradient updates (hard every N, soft with tau)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.modules import QValueActor
from torchrl.objectives import DQNLoss

from tdrl.objectives.update import NonFiniteLossError, TargetUpdate, Updater


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def test_step_matches_hand_computed_sgd_with_clipping():
    net = _linear()
    x = torch.randn(8, 3)
    w0, b0 = net.weight.detach().clone(), net.bias.detach().clone()
    updater = Updater(torch.optim.SGD(net.parameters(), lr=0.1), max_grad_norm=0.5)
    loss_a = (net(x) ** 2).mean()
    loss_b = net(x).abs().mean()
    out = updater.step(TensorDict({"loss_a": loss_a, "loss_b": loss_b, "entropy": torch.tensor(3.0)}))
    # by hand: gradient of the summed loss, clipped to global norm 0.5, then w -= lr * g
    w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
    y = x @ w.T + b
    total = (y**2).mean() + y.abs().mean()
    gw, gb = torch.autograd.grad(total, [w, b])
    norm = torch.cat([gw.flatten(), gb.flatten()]).norm()
    scale = min(1.0, 0.5 / (norm.item() + 1e-6))
    torch.testing.assert_close(net.weight.detach(), w0 - 0.1 * gw * scale)
    torch.testing.assert_close(net.bias.detach(), b0 - 0.1 * gb * scale)
    assert out["grad_norm"].item() == pytest.approx(norm.item(), rel=1e-5)
    assert out["entropy"].item() == 3.0 and not out["loss_a"].requires_grad
    assert out["lr"].item() == pytest.approx(0.1)
    assert updater.updates == 1


def test_nan_loss_stops_with_key_and_update_without_touching_parameters():
    net = _linear()
    updater = Updater(torch.optim.Adam(net.parameters(), lr=0.1))
    x = torch.randn(4, 3)
    updater.step({"loss_ok": net(x).pow(2).mean()})
    before = [p.detach().clone() for p in net.parameters()]
    bad = net(x).mean() * torch.tensor(float("nan"))
    with pytest.raises(NonFiniteLossError, match=r"loss_value = nan at gradient update 1") as err:
        updater.step({"loss_ok": net(x).pow(2).mean(), "loss_value": bad})
    assert err.value.key == "loss_value" and err.value.update == 1
    for p, q in zip(net.parameters(), before, strict=True):
        assert torch.equal(p, q) and torch.isfinite(p).all()


def test_nan_gradient_from_finite_loss_is_not_stepped():
    net = _linear()
    updater = Updater(torch.optim.SGD(net.parameters(), lr=0.1), max_grad_norm=1.0)
    before = [p.detach().clone() for p in net.parameters()]
    x = torch.zeros(2, 3)
    loss = torch.sqrt(net(x) * 0.0).sum()  # finite value (0), gradient d/dx sqrt(0) = inf -> nan
    with pytest.raises(NonFiniteLossError, match="grad_norm"):
        updater.step({"loss_sqrt": loss})
    for p, q in zip(net.parameters(), before, strict=True):
        assert torch.equal(p, q)


def test_finite_loss_and_norm_whose_sum_overflows_still_step():
    """Loss and gradient norm are checked as one sum; a sum that only overflows float32 must not stop the run."""
    p = torch.nn.Parameter(torch.ones(1))
    updater = Updater(torch.optim.SGD([p], lr=1e-39))
    out = updater.step({"loss_big": (p * 3e38).sum()})  # loss 3e38, gradient 3e38: finite, their sum is inf
    assert out["grad_norm"].item() == pytest.approx(3e38, rel=1e-6)
    assert updater.updates == 1 and p.item() < 1.0


def test_lr_property_sets_every_group():
    net = _linear()
    optim = torch.optim.Adam([{"params": [net.weight]}, {"params": [net.bias], "lr": 5.0}], lr=1.0)
    updater = Updater(optim)
    updater.lr = 0.25
    assert [g["lr"] for g in optim.param_groups] == [0.25, 0.25]


def _dqn_loss():
    torch.manual_seed(0)
    value = QValueActor(TensorDictModule(torch.nn.Linear(2, 3), in_keys=["observation"], out_keys=["action_value"]),
                        in_keys=["observation"], spec=None, action_space="categorical")
    return value, DQNLoss(value, action_space="categorical", delay_value=True)


def _target_weight(loss):
    return loss.target_value_network_params.flatten_keys()["module.0.module.weight"].detach().clone()


def _perturb(value):
    with torch.no_grad():
        for p in value.parameters():
            p.add_(1.0)


def test_hard_target_update_every_interval_gradient_updates():
    value, loss = _dqn_loss()
    target = TargetUpdate(loss, interval=3)
    t0 = _target_weight(loss)
    did = []
    for _ in range(7):
        _perturb(value)
        did.append(target.step())
        if did[-1]:
            online = dict(value.named_parameters())["module.0.module.weight"].detach()
            torch.testing.assert_close(_target_weight(loss), online)
        elif len(did) < 3:
            torch.testing.assert_close(_target_weight(loss), t0)
    assert did == [False, False, True, False, False, True, False]
    assert target.target_updates == 2


def test_soft_target_update_polyak():
    value, loss = _dqn_loss()
    target = TargetUpdate(loss, interval=1, tau=0.1)
    t0 = _target_weight(loss)
    _perturb(value)
    online = dict(value.named_parameters())["module.0.module.weight"].detach().clone()
    target.step()
    torch.testing.assert_close(_target_weight(loss), 0.9 * t0 + 0.1 * online)


def test_updater_drives_target_and_checkpoints_counts():
    value, loss = _dqn_loss()
    updater = Updater(torch.optim.SGD(value.parameters(), lr=0.1), target_update=TargetUpdate(loss, interval=2))
    td = TensorDict({"loss_q": dict(value.named_parameters())["module.0.module.weight"].sum()})
    for _ in range(4):
        updater.step(TensorDict({"loss_q": sum(p.sum() for p in value.parameters())}))
    assert updater.target_update.target_updates == 2
    state = updater.state_dict()
    _, loss2 = _dqn_loss()
    value2 = loss2.value_network
    updater2 = Updater(torch.optim.SGD(value2.parameters(), lr=0.1), target_update=TargetUpdate(loss2, interval=2))
    updater2.load_state_dict(state)
    assert updater2.updates == 4 and updater2.target_update.calls == 4
    del td
