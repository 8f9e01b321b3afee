"""Replay ``device=``: samples land on the learner's device with the host sample's values; the data stays on the host
(``copy_on_device``: a copy of it is kept on the device too, and samples are gathered there).

``cpu`` must give the host sample bit for bit; ``meta`` (a device every torch build has) runs the transfer path on a
CPU-only machine: every leaf moves, none is left behind; ``cuda`` (gpu) goes through pinned memory and
non-blocking copies and must not synchronise the host.
"""

from __future__ import annotations

import contextlib
import pickle

import pytest
import torch

from tdrl.replay import FrameStack, PrioritizedSampler, ReplayError, SequenceReplayBuffer, TransitionReplayBuffer
from tests.replay.helpers import atari_episodes, make_stream
from tests.replay.test_sequence import STATE, _batch

DEVICES = ["cpu", "meta", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def _transition(path, device, *, n_step=1, prioritized=False, clip_reward=False):
    sampler = PrioritizedSampler(alpha=0.6, seed=0) if prioritized else None
    rb = TransitionReplayBuffer(path, 400, n_step=n_step, gamma=0.9, sampler=sampler, clip_reward=clip_reward,
                                seed=0, device=device)
    rb.extend(make_stream(4, 60, seed=1))
    return rb


def _frames(path, device):
    rb = TransitionReplayBuffer(path, 200, n_step=2, frame_stack=FrameStack(4, padding="zero"), seed=0,
                                device=device)
    rb.extend(atari_episodes(2, 30, seed=0, padding="zero"))
    return rb


def _sequence(path, device):
    rb = SequenceReplayBuffer(path, 3 * 96, warmup_T=4, batch_T=8, lookahead_T=2, rnn_state_interval=8,
                              state_keys=[STATE], sampler=PrioritizedSampler(alpha=0.6, seed=0), seed=0,
                              device=device)
    rb.extend(_batch(3, 40, 0))
    return rb


BUFFERS = {
    "uniform": (_transition, 32),
    "nstep-clip": (lambda p, d: _transition(p, d, n_step=3, clip_reward=True), 32),
    "prioritized": (lambda p, d: _transition(p, d, n_step=2, prioritized=True), 32),
    "frame-stack": (_frames, 8),
    "sequence": (_sequence, 4),
}


def _no_sync(device: str):
    if device != "cuda":
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def mode():
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return mode()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", list(BUFFERS))
def test_samples_land_on_the_device_with_the_host_values(tmp_path, kind, device):
    build, n = BUFFERS[kind]
    host, moved = build(tmp_path / "host", None), build(tmp_path / device, device)
    for _ in range(3):
        expected = host.sample(n)
        with _no_sync(device):  # a CUDA sample does not wait for the device
            sample = moved.sample(n)
        assert sample.batch_size == expected.batch_size
        keys = set(expected.keys(True, True))
        assert set(sample.keys(True, True)) == keys
        for key in keys:
            got, want = sample[key], expected[key]
            assert got.device.type == device, key
            assert (got.dtype, got.shape) == (want.dtype, want.shape), key
            if device != "meta":
                assert torch.equal(got.cpu(), want), key
    assert host.samples_drawn == moved.samples_drawn
    for key, value in moved.ring.fields.items():  # the stored data stays in host memory
        assert value.device.type == "cpu", key


def test_sequence_broadcasts_stay_views_on_the_device(tmp_path):
    rb = _sequence(tmp_path / "seq", "meta")
    s = rb.sample(4)
    assert s[STATE].device.type == "meta" and s[STATE].stride(1) == 0  # one stored state per sequence moved
    assert s["index"].stride(1) == 0 and s["priority_weight"].stride(1) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_samples_are_staged_in_pinned_memory(tmp_path, monkeypatch):
    rb = _transition(tmp_path / "rb", "cuda", n_step=3)
    staged = []
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):  # records host-to-GPU copies (not dtype conversions)
        targets = [*args, kwargs.get("device")]
        if self.device.type == "cpu" and any(isinstance(t, (str, torch.device)) and "cuda" in str(t) for t in targets):
            staged.append((self.is_pinned(), kwargs.get("non_blocking", False)))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    rb.sample(16)
    assert staged and all(pinned and non_blocking for pinned, non_blocking in staged)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_step, prioritized", [(1, False), (3, False), (2, True)])
def test_device_copy_gives_the_host_samples_while_the_ring_wraps(tmp_path, device, n_step, prioritized):
    """copy_on_device=True: samples gathered from the copy equal the host's, extend after extend, as the ring wraps
    (a refresh then copies two slices) -- on the CPU the same code runs with the copy in host memory."""
    def build(path, **kwargs):
        sampler = PrioritizedSampler(alpha=0.6, seed=0) if prioritized else None
        return TransitionReplayBuffer(path, 4 * 50, n_step=n_step, gamma=0.9, sampler=sampler, clip_reward=True,
                                      seed=0, **kwargs)

    host, copied = build(tmp_path / "host"), build(tmp_path / "copy", device=device, copy_on_device=True)
    for i, steps in enumerate([30, 7, 13, 50, 21, 44]):  # T_cap = 50 per stream: wraps three times
        batch = make_stream(4, steps, seed=i)
        host.extend(batch)
        copied.extend(batch)
        expected = host.sample(16)
        with _no_sync(device):  # refresh and gather without waiting for the GPU
            sample = copied.sample(16)
        assert copied._copy is not None and copied._copy.copied == copied.ring.write_done
        for key in expected.keys(True, True):
            assert sample[key].device.type == device, key
            if device != "meta":
                assert torch.equal(sample[key].cpu(), expected[key]), (i, key)
    if device != "meta":  # the copy holds exactly the stored data
        for group, copy in copied._copy.groups.items():
            assert torch.equal(copy.cpu(), copied.ring.store.fields[group]), group


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_step, padding", [(1, "zero"), (3, "zero"), (2, "reset")])
def test_frame_stacks_from_the_device_copy_equal_the_hosts_while_the_ring_wraps(tmp_path, device, n_step, padding):
    """copy_on_device=True with a frame stack: the frames are copied too (FrameCopy) and every stack is gathered
    from the copy, equal to the host's sample extend after extend, as the frame ring wraps; episodes end inside
    n-step windows (the next stack then ends at the episode's final frame)."""
    def build(path, **kwargs):
        return TransitionReplayBuffer(path, 2 * 40, n_step=n_step, gamma=0.9, seed=0,
                                      frame_stack=FrameStack(4, padding=padding, slack=0.5), **kwargs)

    host, copied = build(tmp_path / "host"), build(tmp_path / "copy", device=device, copy_on_device=True)
    for i in range(5):  # 2 streams x 30 steps per extend, 40 per stream held: the frame ring wraps
        batch = atari_episodes(2, 30, seed=i, padding=padding)
        host.extend(batch)
        copied.extend(batch)
        expected = host.sample(24)
        with _no_sync(device):
            sample = copied.sample(24)
        for key in expected.keys(True, True):
            assert sample[key].device.type == device, key
            if device != "meta":
                assert torch.equal(sample[key].cpu(), expected[key]), (i, key)
    assert copied._frames is not None
    if device != "meta":
        assert torch.equal(copied._frames.pixels.cpu(), copied.ring.field("frames.pixels"))


def test_device_copy_refuses_a_writer_in_another_process(tmp_path):
    rb = _transition(tmp_path / "rb", "cpu")
    rb.copy_on_device = True
    rb.sample(4)
    rb.ring.store.begin_write(5)  # what a collector process does while this one samples
    with pytest.raises(ReplayError, match="needs its writes in this process"):
        rb.sample(4)


def test_device_copy_choices(tmp_path):
    auto = _transition(tmp_path / "auto", "cpu")
    auto.copy_on_device = None
    auto.sample(4)
    assert auto._copy is None and auto.copy_on_device is False  # auto copies to a GPU only
    with pytest.raises(ValueError, match="copy_on_device=True needs device="):
        TransitionReplayBuffer(tmp_path / "x", 100, copy_on_device=True)
    frames = TransitionReplayBuffer(tmp_path / "y", 100, device="cpu", frame_stack=FrameStack(4), copy_on_device=None)
    assert frames.copy_on_device is False  # auto leaves a frame stack on the host until a GPU has measured it
    copied = _transition(tmp_path / "copied", "cpu")
    copied.copy_on_device = True
    copied.sample(4)
    assert pickle.loads(pickle.dumps(copied))._copy is None  # the copy stays in this process
