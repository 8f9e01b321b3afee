"""Shared access: one process extends while another samples; no half-written transition is ever returned."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdrl.replay import PrioritizedSampler, SequenceReplayBuffer, TransitionReplayBuffer

OBS_DIM = 512  # large rows make a torn copy likely to be visible if the protocol were wrong


def _versioned(B: int, T: int, t0: int) -> TensorDict:
    """Every field of step (b, a) encodes (b, a): a transition mixing two writes cannot be consistent."""
    code = torch.arange(B, dtype=torch.float32).unsqueeze(1) * 1e6 + torch.arange(t0, t0 + T, dtype=torch.float32)
    return TensorDict({
        "observation": code.unsqueeze(-1).expand(B, T, OBS_DIM).clone(),
        "action": code.unsqueeze(-1).clone(),
        ("recurrent_state", "h"): code.unsqueeze(-1).expand(B, T, 8).clone(),
        "next": {"observation": (code + 0.5).unsqueeze(-1).expand(B, T, OBS_DIM).clone(),
                 "reward": code.unsqueeze(-1).clone(),
                 "done": torch.zeros(B, T, 1, dtype=torch.bool)},
    }, batch_size=[B, T])


def _consistent(sample: TensorDict) -> bool:
    code = sample["action"][..., 0]
    obs = sample["observation"]
    ahead = sample.get("steps_to_next_obs", torch.ones_like(code).long().unsqueeze(-1)) - 1
    ok = bool((obs == code.unsqueeze(-1)).all() and (sample["next", "observation"] == obs + ahead + 0.5).all())
    if "steps_to_next_obs" not in sample.keys():
        ok = ok and bool((sample["next", "reward"][..., 0] == code).all())
    return ok


def _writer(rb, batches: int, B: int, T: int, start_batch: int, started, stop) -> None:
    torch.set_num_threads(1)
    for i in range(start_batch, start_batch + batches):
        if stop.is_set():
            return
        rb.extend(_versioned(B, T, i * T))
        started.set()


def _run_concurrently(rb, B, T, batch, sample_fn, check, seconds=3.0):
    rb.extend(_versioned(B, T, 0))  # first batch in this process
    ctx = mp.get_context("spawn")
    started, stop = ctx.Event(), ctx.Event()
    writer = ctx.Process(target=_writer, args=(rb, 100_000, B, T, 1, started, stop), daemon=True)
    writer.start()
    assert started.wait(60), "writer process did not start writing"
    samples, deadline = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and writer.is_alive():
            s = sample_fn(batch)
            assert check(s), "sample mixed data from two writes"
            samples += 1
        assert writer.is_alive(), f"writer died with exit code {writer.exitcode}"
    finally:
        stop.set()  # stop between extends, so the buffer is left consistent for the checks below
        writer.join(20)
        if writer.is_alive():
            writer.kill()
            writer.join(5)
    return samples


@pytest.mark.timeout(90)
def test_concurrent_extend_and_uniform_sample(tmp_path):
    B, T = 4, 16
    # 1024 steps per stream: the writer laps the ring every ~64 extends (many times in 3 s, so samples do meet
    # overwritten slots), but not within one gather; a 64-step ring was lapped faster than a 32-row gather on 2
    # busy cores, which is the documented "writer is lapping the buffer" error, not a torn read
    rb = TransitionReplayBuffer(tmp_path / "rb", B * 1024, n_step=3, gamma=0.5, seed=0)
    samples = _run_concurrently(rb, B, T, 32, rb.sample,
                                _consistent)
    assert samples > 20
    # counters are shared: the writer's extends are visible here
    assert rb.write_count > B * T * 10
    assert rb.samples_drawn == 32 * samples


@pytest.mark.timeout(90)
def test_concurrent_extend_and_prioritized_sample_update(tmp_path):
    B, T = 4, 16
    sampler = PrioritizedSampler(alpha=0.6, seed=0)
    # 1024 steps per stream, as in the uniform test: a 64-step ring was lapped within one gather when 4 processes
    # shared the 2 cores (the documented "writer is lapping the buffer" error, not a torn read)
    rb = TransitionReplayBuffer(tmp_path / "rb", B * 1024, sampler=sampler, seed=0)
    rng = np.random.default_rng(0)

    def sample_and_update(n):
        s = rb.sample(n)
        rb.update_priority(s["index"], torch.from_numpy(rng.random(n)))
        return s

    samples = _run_concurrently(rb, B, T, 32, sample_and_update, _consistent)
    assert samples > 20
    with rb.ring.store.lock():  # the tree's sums agree with its leaves after concurrent updates
        total = sampler.total
        sampler._tree.rebuild()
        assert sampler.total == pytest.approx(total, rel=1e-9)
        # only ready slots are sampleable: newest step of each stream is ready (n_step=1), nothing beyond
        assert int((sampler.leaf_values(np.arange(rb.ring.capacity)) > 0).sum()) == rb.ready_count()


@pytest.mark.timeout(90)
def test_concurrent_extend_and_sequence_sample(tmp_path):
    B, T = 2, 16
    # 1024 steps per stream, as the uniform test's: a 96-step ring was lapped during a gather on 2 busy cores (CI,
    # 2026-11-27), the documented "writer is lapping the buffer" error, not a torn read
    rb = SequenceReplayBuffer(tmp_path / "seq", B * 1024, batch_T=8, warmup_T=4, rnn_state_interval=8,
                              state_keys=[("recurrent_state", "h")], seed=0)

    def check(s):
        code = s["action"][..., 0]
        steps_ok = bool((code - code[:, :1] == torch.arange(code.shape[1])).all())
        return steps_ok and _consistent(s) and bool((s["recurrent_state", "h"][:, 0, 0] == code[:, 0]).all())

    assert _run_concurrently(rb, B, T, 4, rb.sample, check) > 20


def test_sample_during_a_write_never_returns_slots_being_written(tmp_path):
    """Deterministic seqlock check: freeze a write half-way and sample."""
    B, T = 2, 16
    rb = TransitionReplayBuffer(tmp_path / "rb", B * 64, seed=0)
    for i in range(6):  # wraps: the next write overwrites the oldest steps
        rb.extend(_versioned(B, T, i * T))
    start = rb.ring.store.begin_write(T)
    half = _versioned(B, T, start)
    rb.ring.write(rb.ring.fields[("observation",)], half["observation"], start)  # one field written, others not
    overwritten = set(range(start - 64, start - 64 + T))
    for _ in range(50):
        s = rb.sample(64)
        t = (s["action"][:, 0] % 1e6).long().tolist()
        assert not overwritten & set(t)
        assert _consistent(s)
    rb.ring.write_columns(rb.ring.check(half)[0], start)
    rb.ring.store.end_write()
    assert _consistent(rb.sample(64))
