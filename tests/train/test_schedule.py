"""One schedule for every trainer: the sync, async and Ray trainers built from the same :class:`Schedule` start
learning at the same frame (the Ray trainer once started a fraction of a batch later: it did not round
``min_steps_learn`` down to whole iterations)."""

from __future__ import annotations

import functools

import pytest
import torch

from tdrl.collect import make_collector
from tdrl.config import RayConfig
from tdrl.distributed import RayTrainer
from tdrl.envs import EnvFactory
from tdrl.replay import TransitionReplayBuffer
from tdrl.train import AsyncTrainer, Schedule, SyncTrainer
from tdrl.train.schedule import owed_updates

B, T = 2, 64  # 128 frames per iteration
SCHEDULE = Schedule(n_steps=1024, log_interval_steps=512, min_steps_learn=300, replay_ratio=4, batch_size=32)


def test_schedule_in_iterations():
    cadence = SCHEDULE.cadence(B * T)
    assert (cadence.n_itr, cadence.log_interval_itrs, cadence.checkpoint_interval_itrs) == (8, 4, 4)
    assert cadence.min_itr_learn == 2 and cadence.learn_start_frames == 256  # 300 rounded down to whole iterations
    assert [cadence.learning(i) for i in range(4)] == [False, False, True, True]
    with pytest.raises(ValueError, match="replay_ratio and batch_size go together"):
        Schedule(n_steps=10, log_interval_steps=10, replay_ratio=4)


def test_sync_async_and_ray_trainers_start_learning_at_the_same_frame(tmp_path):
    env = EnvFactory("CartPole-v1")
    factory = functools.partial(make_collector, "serial", env, None, batch_B=B, batch_T=T, seed=0)
    replay = TransitionReplayBuffer(tmp_path / "replay", 4096)
    policy = torch.nn.Linear(4, 2)
    sync = SyncTrainer(collector=factory(), replay=replay, schedule=SCHEDULE)
    async_ = AsyncTrainer(collector_factory=factory, replay=replay, policy=policy, schedule=SCHEDULE)
    ray = RayTrainer(collector_factory=factory, replay=replay, policy=policy, schedule=SCHEDULE, ray=RayConfig())
    # the sync trainer's first update: iteration 2, on the frames collected up to 384
    first_update_frames = None
    for _ in sync:
        if sync.updates_due and first_update_frames is None:
            first_update_frames = sync.frames
        sync.record(updates=sync.updates_due)
    assert first_update_frames == 384 and sync.updates == 6 * 16  # 4 x 128 / 32 per iteration
    # the async and Ray throttles count from the same frame: nothing owed with 256 frames written, the sync
    # trainer's 16 updates of its first learning iteration owed at 384, and the same total over the run
    for trainer in (async_, ray):
        start = trainer.cadence.learn_start_frames
        owed = [owed_updates(replay_ratio=4, batch_size=32, write_count=w, samples_drawn=0, learn_start_frames=start,
                             ready=w) for w in (256, 384, 1024)]
        assert owed == [0, 16, 6 * 16], type(trainer).__name__
