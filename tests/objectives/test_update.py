"""Updater: a step equals a hand-computed SGD step; a NaN loss/gradient is skipped on the device (parameters and
optimizer state unchanged) and reported at check_finite; an update reads nothing back to the host; target updates
are counted in gradient updates (hard every N, soft with tau)."""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReadError, forbid_host_reads
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


def _state(optim):
    return {i: {k: torch.as_tensor(v).clone() for k, v in s.items()} for i, s in optim.state_dict()["state"].items()}


def _assert_same(net_a, optim_a, net_b, optim_b):
    for p, q in zip(net_a.parameters(), net_b.parameters(), strict=True):
        assert torch.equal(p, q) and torch.isfinite(p).all()
    a, b = _state(optim_a), _state(optim_b)
    assert a.keys() == b.keys()
    for i in a:
        assert a[i].keys() == b[i].keys()
        for k in a[i]:
            assert torch.equal(a[i][k], b[i][k]), (i, k, a[i][k], b[i][k])


OPTIMIZERS = {  # name: (factory, whether the skip is decided on the device)
    "adam-fused": (lambda ps: torch.optim.Adam(ps, lr=0.1, fused=True), True),
    "adamw-fused": (lambda ps: torch.optim.AdamW(ps, lr=0.1, fused=True), True),
    "adagrad-fused": (lambda ps: torch.optim.Adagrad(ps, lr=0.1, fused=True), True),
    "adam": (lambda ps: torch.optim.Adam(ps, lr=0.1), False),
    "rmsprop-foreach": (lambda ps: torch.optim.RMSprop(ps, lr=0.1, foreach=True), False),
    "sgd-momentum-fused": (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True), False),
}


@pytest.mark.parametrize("first", [False, True], ids=["after-a-step", "first-step"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_nan_loss_is_skipped_without_a_trace_then_reported(name, first):
    """A NaN loss term leaves parameters AND optimizer state as if that update had never run (also as the very first
    step, when the optimizer creates its state); check_finite then names the term and the update, once."""
    make, on_device = OPTIMIZERS[name]
    (net, twin), x = [_linear() for _ in range(2)], torch.randn(4, 3)
    updater, reference = Updater(make(net.parameters())), Updater(make(twin.parameters()))
    assert updater.skips_on_device is on_device
    if not first:
        updater.step({"loss_ok": net(x).pow(2).mean(), "loss_value": net(x).mean()})
        reference.step({"loss_ok": twin(x).pow(2).mean(), "loss_value": twin(x).mean()})
    before = [p.detach().clone() for p in net.parameters()]
    bad = net(x).mean() * torch.tensor(float("nan"))
    out = updater.step({"loss_ok": net(x).pow(2).mean(), "loss_value": bad})  # no error here: no host read
    assert torch.isnan(out["loss_value"]) and all(map(torch.equal, net.parameters(), before))
    index = 0 if first else 1
    with pytest.raises(NonFiniteLossError, match=rf"loss_value = nan at gradient update {index}; 1 update") as err:
        updater.check_finite()
    assert err.value.key == "loss_value" and err.value.update == index and err.value.skipped == 1
    updater.check_finite()  # reported once
    updater.step({"loss_ok": net(x).pow(2).mean(), "loss_value": net(x).mean()})
    reference.step({"loss_ok": twin(x).pow(2).mean(), "loss_value": twin(x).mean()})
    _assert_same(net, updater.optimizer, twin, reference.optimizer)  # the finite update after it is applied
    assert not torch.equal(next(net.parameters()), before[0])
    updater.check_finite()


def test_nan_gradient_from_finite_loss_is_skipped():
    net, twin = _linear(), _linear()
    updater = Updater(torch.optim.Adam(net.parameters(), lr=0.1, fused=True), max_grad_norm=1.0)
    loss = torch.sqrt(net(torch.zeros(2, 3)) * 0.0).sum()  # finite value (0), gradient d/dx sqrt(0) = inf -> nan
    updater.step({"loss_sqrt": loss})
    reference = Updater(torch.optim.Adam(twin.parameters(), lr=0.1, fused=True), max_grad_norm=1.0)
    for u, n in ((updater, net), (reference, twin)):  # then a finite step: as if the first had never run
        u.step({"loss_ok": n(torch.ones(2, 3)).pow(2).sum()})
    _assert_same(net, updater.optimizer, twin, reference.optimizer)
    with pytest.raises(NonFiniteLossError, match="grad_norm = nan at gradient update 0"):
        updater.check_finite()


def test_first_non_finite_update_is_named_and_later_ones_counted():
    net = _linear()
    updater = Updater(torch.optim.Adam(net.parameters(), lr=0.1, fused=True))
    x = torch.randn(4, 3)
    for i in range(6):
        scale = torch.tensor(float("inf") if i in (2, 4) else 1.0)
        updater.step({"loss_a": net(x).pow(2).mean() * scale})
    with pytest.raises(NonFiniteLossError, match=r"loss_a = inf at gradient update 2; 2 update\(s\) skipped"):
        updater.check_finite()
    updater.step({"loss_a": net(x).pow(2).mean() * torch.tensor(float("nan"))})
    with pytest.raises(NonFiniteLossError, match="at gradient update 6;") as err:  # counted over checks
        updater.check_finite()
    assert err.value.skipped == 1


def test_fused_update_reads_nothing_back_to_the_host():
    """The device half of an update (loss, backward, norm, clip, skip flag, fused step) and its host half (counters,
    target update) read no tensor value: on a GPU the host never waits for an update."""
    value, loss = _dqn_loss()
    updater = Updater(torch.optim.Adam(value.parameters(), lr=1e-3, fused=True), max_grad_norm=1.0,
                      target_update=TargetUpdate(loss, interval=2, tau=0.5))
    x = TensorDict({"observation": torch.randn(8, 2)}, [8])
    with forbid_host_reads():
        for _ in range(3):  # the first creates the optimizer state, the second the target update
            updater.step({"loss_q": value(x.clone())["action_value"].pow(2).mean()})
        updater.lr = 5e-4
    updater.check_finite()
    assert updater.updates == 3 and updater.target_update.target_updates == 1


def test_host_read_sentinel_catches_the_old_check():
    net = _linear()
    loss = net(torch.randn(2, 3)).sum()
    with forbid_host_reads(), pytest.raises(HostReadError, match="__bool__"):
        if not torch.isfinite(loss):
            pass


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


CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _learner_on(device, tensor_lr):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device)
    lr = torch.tensor(0.01, device=device) if tensor_lr else 0.01
    return net, Updater(torch.optim.Adam(net.parameters(), lr=lr, fused=True), max_grad_norm=1.0)


def _steps(net, updater, n, seed):
    g = torch.Generator().manual_seed(seed)
    device = next(net.parameters()).device
    for _ in range(n):
        x, y = torch.randn(16, 3, generator=g).to(device), torch.randn(16, 1, generator=g).to(device)
        updater.step({"loss_mse": (net(x) - y).pow(2).mean()})


@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float-lr", "tensor-lr"])
@pytest.mark.parametrize("saved_on, resumed_on", [
    ("cpu", "cpu"), pytest.param("cuda", "cpu", marks=CUDA), pytest.param("cpu", "cuda", marks=CUDA)])
def test_updater_checkpoint_resumes_on_another_device(tmp_path, saved_on, resumed_on, tensor_lr):
    """What a trainer does: save through the Checkpointer, load with map_location="cpu", load_state_dict into an
    updater on the resuming device. The optimizer state lands on the parameters' device, a tensor learning rate
    stays the resuming updater's tensor, and training continues as it would have without the interruption."""
    from tdrl.ckpt import Checkpointer

    net, updater = _learner_on(saved_on, tensor_lr)
    _steps(net, updater, 5, seed=1)
    updater.lr = 0.005
    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save({"model": net.state_dict(), "updater": updater.state_dict()}, 0)
    state, _ = ckpt.load_latest(map_location="cpu")

    net2, updater2 = _learner_on(resumed_on, tensor_lr)
    lr_tensor = updater2.optimizer.param_groups[0]["lr"]
    net2.load_state_dict(state["model"])
    updater2.load_state_dict(state["updater"])
    assert updater2.updates == 5 and updater2.lr == pytest.approx(0.005)
    group = updater2.optimizer.param_groups[0]
    if tensor_lr:  # the same tensor a captured graph reads, now holding the saved rate
        assert group["lr"] is lr_tensor and group["lr"].device.type == resumed_on
    for p in net2.parameters():
        for key, value in updater2.optimizer.state[p].items():
            assert value.device == p.device, key
    if saved_on == resumed_on:  # then bit for bit as an uninterrupted run
        _steps(net, updater, 3, seed=2)
        _steps(net2, updater2, 3, seed=2)
        for p, q in zip(net.parameters(), net2.parameters(), strict=True):
            assert torch.equal(p, q)
    else:
        _steps(net2, updater2, 3, seed=2)
        assert all(torch.isfinite(p).all() for p in net2.parameters())
    updater2.check_finite()
