"""Collectors: ``[batch_B, batch_T]`` TensorDict batches (time last) from gymnasium envs at rlpyt speed.

API (TorchRL's collector protocol)::

    from tdrl.collect import make_collector
    from tdrl.utils.stats import summarize_records
    collector = make_collector("serial", EnvFactory("CartPole-v1"), policy, batch_B=8, batch_T=128, seed=0,
                               total_frames=100_000)
    for batch in collector:               # until total_frames (-1: endless); collect() returns one batch
        episodes = collector.traj_infos   # TrajInfo dicts of the episodes finished during this batch
        ...                               # e.g. summarize_records(episodes)["train/return_mean"]
        collector.update_policy_weights_()
    collector.shutdown()                  # idempotent; collectors are also context managers

The batch layout is documented in :mod:`tdrl.collect.batch` (rlpyt's ``samples[t, b]`` is ``batch[b, t]``).
``traj_infos`` hold ``Length``, ``Return``, ``NonzeroRewards``, ``DiscountedReturn`` (+ ``GameScore`` on Atari,
``<group>/Return`` per agent group), computed on the env's raw reward. Kinds (:func:`make_collector`): ``serial``
(one process, ``breakpoint()`` works), ``parallel`` (worker processes with policy copies; rlpyt's CpuSampler),
``action_server`` and ``alternating`` (workers step envs, this process acts; rlpyt's GpuSampler /
AlternatingSampler), ``torchrl`` (TorchRL's own collectors), ``batched_env`` (one torch env object of ``batch_B``
envs in this process: VMAS, :mod:`tdrl.collect.batched_env`). Same seed + deterministic policy => every tdrl kind
but ``batched_env`` (whose envs no other kind steps) yields the serial batches. :func:`make_eval_collector` runs
whole greedy episodes on its own envs.

``state_dict()`` (between batches) holds each env's state, the episodes in progress, recurrent policy state and
worker RNGs: a collector rebuilt with the same arguments and ``load_state_dict``-ed continues bitwise (the
caller restores its own torch RNG, as the trainers do). Envs that cannot be captured (warned at build) and the
``torchrl`` kind restart their episodes.
"""

from tdrl.collect.collector import BatchCollector
from tdrl.collect.common import Collector, CollectorError
from tdrl.collect.evaluation import EvalCollector, make_eval_collector
from tdrl.collect.factory import (
    COLLECTOR_KINDS,
    ParallelCollector,
    SerialCollector,
    make_collector,
    start_workers_early,
)
from tdrl.collect.policy import PolicyStep

__all__ = [
    "COLLECTOR_KINDS", "BatchCollector", "Collector", "CollectorError", "EvalCollector", "ParallelCollector",
    "PolicyStep", "SerialCollector", "make_collector", "make_eval_collector", "start_workers_early"
]
