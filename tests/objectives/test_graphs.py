"""optim.cudagraphs: update_step refuses a non-CUDA device; a replayed update equals the eager one, skips a NaN
update on the device, follows a learning rate schedule and never waits for the GPU (gpu tests)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.config import UserError
from tdrl.objectives.graphs import CudaGraphUpdate, graph_lr, static_like, update_step
from tdrl.objectives.update import NonFiniteLossError, Updater


def test_update_step_is_the_function_itself_without_cudagraphs():
    def fn(sample):
        return sample

    assert update_step(fn, cudagraphs=False, device=torch.device("cpu")) is fn
    assert graph_lr(1e-3, torch.device("cpu"), False) == 1e-3


def test_cudagraphs_on_cpu_is_a_user_error():
    with pytest.raises(UserError, match=r"optim.cudagraphs=true replays CUDA graphs, but run.device='cpu'"):
        update_step(lambda sample: sample, cudagraphs=True, device=torch.device("cpu"))


def _replay_sample(tmp_path, device=None):
    from tdrl.replay import TransitionReplayBuffer
    from tests.replay.helpers import make_stream

    replay = TransitionReplayBuffer(tmp_path / "rb", 400, n_step=3, gamma=0.9, seed=0, device=device,
                                    copy_on_device=device is not None)  # gathered on the device: views there too
    replay.extend(make_stream(4, 60, seed=1))
    return replay, replay.sample(16)


def test_static_copy_keeps_the_strides_a_compiled_loss_was_compiled_for(tmp_path):
    """A replay sample's leaves are views of grouped storage; the graph's input buffers keep their strides (a
    contiguous copy would recompile a compiled loss inside the capture: the first GPU check's DQN and SAC rows)."""
    replay, sample = _replay_sample(tmp_path)
    static = static_like(sample)
    assert any(not v.is_contiguous() for v in sample.values(True, True))
    for key, value in sample.items(True, True):
        assert static[key].stride() == value.stride() and torch.equal(static[key], value), key
        assert static[key].data_ptr() != value.data_ptr(), key

    loss = torch.compile(lambda td: (td["observation"].float().sum(-1) * td["next", "reward"].squeeze(-1)).mean())
    loss(sample)
    with torch.compiler.set_stance("fail_on_recompile"):  # the stance the capture runs under
        loss(static_like(replay.sample(16)))
        with pytest.raises(RuntimeError, match="recompile"):
            loss(sample.clone())  # what the capture used to read


def test_static_copy_of_a_broadcast_leaf_is_contiguous():
    sample = TensorDict({"state": torch.randn(4, 1, 3).expand(4, 5, 3)}, [4])
    static = static_like(sample)
    assert static["state"].is_contiguous() and torch.equal(static["state"], sample["state"])


def _learner(device, cudagraphs):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    optim = torch.optim.Adam(net.parameters(), lr=graph_lr(1e-2, device, cudagraphs), fused=True,
                             capturable=cudagraphs)
    updater = Updater(optim, max_grad_norm=1.0)

    def learn(sample):
        return updater.apply({"loss_mse": (net(sample["x"]) - sample["y"]).pow(2).mean()})

    return net, updater, update_step(learn, cudagraphs=cudagraphs, device=device)


def _samples(device, n=12):
    g = torch.Generator().manual_seed(1)
    return [TensorDict({"x": torch.randn(16, 4, generator=g), "y": torch.randn(16, 1, generator=g)}, [16]).to(device)
            for _ in range(n)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replayed_updates_equal_eager_ones_and_never_sync():
    device = torch.device("cuda", torch.cuda.current_device())
    (net, updater, learn), (twin, eager_updater, eager) = _learner(device, True), _learner(device, False)
    assert isinstance(learn, CudaGraphUpdate)
    for i, sample in enumerate(_samples(device)):
        if i > learn.warmup:  # after the capture: no host wait at all
            torch.cuda.set_sync_debug_mode("error")
        try:
            out = learn(sample)
            updater.advance()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        want = eager(sample)
        eager_updater.advance()
        torch.testing.assert_close(out["loss_mse"], want["loss_mse"])
        if i == 6:  # a schedule's new rate reaches the captured step
            updater.lr = eager_updater.lr = 1e-3
    assert learn.graph is not None
    for p, q in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replayed_nan_update_is_skipped_and_reported():
    device = torch.device("cuda", torch.cuda.current_device())
    net, updater, learn = _learner(device, True)
    samples = _samples(device, 6)
    for sample in samples:  # warm up and capture
        learn(sample)
        updater.advance()
    updater.check_finite()
    before = [p.detach().clone() for p in net.parameters()]
    state = {i: {k: v.clone() for k, v in s.items()} for i, s in updater.optimizer.state_dict()["state"].items()}
    bad = samples[0].clone()
    bad["y"][0] = float("nan")
    learn(bad)
    updater.advance()
    assert all(map(torch.equal, net.parameters(), before))
    for i, s in updater.optimizer.state_dict()["state"].items():
        assert all(torch.equal(v, state[i][k]) for k, v in s.items())
    with pytest.raises(NonFiniteLossError, match=r"loss_mse = nan at gradient update 6"):
        updater.check_finite()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_loss_on_replay_samples_is_captured_without_recompiling(tmp_path):
    """optim.compile with optim.cudagraphs, as recipes/dqn.py wires them: a compiled loss over replay samples (views
    of grouped storage), warmed up, captured and replayed; the replays equal the eager loss."""
    device = torch.device("cuda", torch.cuda.current_device())
    replay, sample = _replay_sample(tmp_path, device)
    assert any(not v.is_contiguous() for v in sample.values(True, True))
    torch.manual_seed(0)
    net = torch.nn.Linear(sample["observation"].shape[-1], 1).to(device)

    def loss(td):
        return ((net(td["observation"].float()) - td["next", "reward"]) ** 2).mean()

    compiled = torch.compile(loss)
    learn = CudaGraphUpdate(lambda td: TensorDict({"loss": compiled(td).detach()}), device=device)
    for _ in range(learn.warmup + 4):
        sample = replay.sample(16)
        torch.testing.assert_close(learn(sample)["loss"], loss(sample).detach())
    assert learn.graph is not None
