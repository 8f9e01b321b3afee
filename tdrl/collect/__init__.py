"""Collectors: ``[B, T]`` TensorDict batches from gymnasium envs at rlpyt speed.

API (TorchRL collector protocol)::

    from tdrl.collect import make_collector, traj_info_stats
    collector = make_collector("serial", EnvFactory("CartPole-v1"), policy,
                               batch_B=8, batch_T=128, seed=0, total_frames=100_000,
                               reset_mode="reset_at_once", max_decorrelation_steps=100, discount=0.99)
    for batch in collector:               # TensorDict, batch_size [batch_B, batch_T] (time last)
        episodes = collector.traj_infos   # list of TrajInfo dicts finished during this batch
        ...                               # e.g. traj_info_stats(episodes)["ReturnAverage"]
        collector.update_policy_weights_()
    collector.shutdown()                  # idempotent; collectors are also context managers

* ``collect()`` returns one batch (rlpyt's ``obtain_samples``); iteration stops at ``total_frames``
  (``-1``: endless). ``frames``, ``frames_per_batch``, ``state_dict()``/``load_state_dict()`` (counters).
* Batch keys (see :mod:`tdrl.collect.batch`): ``observation``, ``is_init``, ``action`` and every key the policy
  writes (``action_log_prob``, ``state_value``, ``action_value``, ``logits``, recurrent state...),
  ``("next", "observation"|"reward"|"done"|"terminated"|"truncated")`` with ``[B, T, 1]`` reward/flags,
  ``("collector", "traj_ids"|"mask")``.
* rlpyt's ``samples[t, b]`` is ``batch[b, t]``: ``batch_B`` is the first dim, ``batch_T`` the second.
* ``traj_infos``: ``{"Length", "Return", "NonzeroRewards", "DiscountedReturn"}`` (+ ``"GameScore"`` on Atari)
  per episode finished during the last batch, computed on the env's raw reward.

Kinds (``make_collector(kind, ...)``), each a :class:`BatchCollector` over an engine:

==================  ===========================================================================================
``serial``          one process, ``breakpoint()`` works; the debugging twin (``SerialCollector(...)`` for short).
``parallel``        ``n_workers`` processes, each stepping ``B/W`` envs with its own CPU policy copy, writing a
                    shared-memory batch (rlpyt's CpuSampler). Fastest on CPU.
``action_server``   workers step envs; one batched forward per step in this process on the policy's device
                    (rlpyt's GpuSampler).
``alternating``     two action-server worker groups so stepping and inference overlap (rlpyt's AlternatingSampler).
``torchrl``         TorchRL's ``Collector``/``MultiSyncCollector`` behind this API.
==================  ===========================================================================================

tdrl's models implement :class:`tdrl.models.acting.Acting` and are called on tensors; any other TorchRL policy
runs on a TensorDict of its in_keys. Same seed + deterministic policy => every tdrl kind yields exactly the serial
collector's batches. :func:`make_eval_collector` runs whole greedy episodes on its own envs (``evaluate()``).
"""

from tdrl.collect.collector import BatchCollector
from tdrl.collect.common import Collector, CollectorError
from tdrl.collect.evaluation import EvalCollector, make_eval_collector
from tdrl.collect.factory import (
    COLLECTOR_KINDS,
    ActionServerCollector,
    ParallelCollector,
    SerialCollector,
    TorchRLCollector,
    make_collector,
    start_workers_early,
)
from tdrl.collect.policy import PolicyStep
from tdrl.collect.traj_info import TRAJ_INFO_FIELDS, EpisodeTracker, traj_info_stats

__all__ = [
    "COLLECTOR_KINDS",
    "TRAJ_INFO_FIELDS",
    "ActionServerCollector",
    "BatchCollector",
    "Collector",
    "CollectorError",
    "EpisodeTracker",
    "EvalCollector",
    "ParallelCollector",
    "PolicyStep",
    "SerialCollector",
    "TorchRLCollector",
    "make_collector",
    "make_eval_collector",
    "start_workers_early",
    "traj_info_stats",
]
