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

Kinds (``make_collector(kind, ...)``; each class is also built directly with keyword arguments):

==================  ===========================================================================================
``serial``          :class:`SerialCollector` — one process, ``breakpoint()`` works; the debugging twin.
``parallel``        :class:`ParallelCollector` — ``n_workers`` processes, each stepping ``B/W`` envs with its own
                    CPU policy copy, writing a shared-memory batch (rlpyt's CpuSampler). Fastest on CPU.
``action_server``   :class:`ActionServerCollector` — workers step envs; one batched forward per step in this
                    process on the policy's device (rlpyt's GpuSampler).
``alternating``     :class:`ActionServerCollector` with ``alternating=True`` — two worker groups so stepping and
                    inference overlap (rlpyt's AlternatingSampler).
``torchrl``         :class:`TorchRLCollector` — TorchRL's ``Collector``/``MultiSyncCollector`` behind this API.
==================  ===========================================================================================

Same seed + deterministic policy ⇒ every tdrl kind yields exactly the serial collector's batches.
:class:`EvalCollector` runs greedy evaluations on its own envs (``evaluate()`` → TrajInfos).
"""

from tdrl.collect.action_server import ActionServerCollector
from tdrl.collect.common import CollectorError
from tdrl.collect.evaluation import EvalCollector
from tdrl.collect.factory import COLLECTOR_KINDS, make_collector, start_workers_early
from tdrl.collect.parallel import ParallelCollector
from tdrl.collect.policy import PolicyStep
from tdrl.collect.serial import SerialCollector
from tdrl.collect.torchrl_adapter import TorchRLCollector
from tdrl.collect.traj_info import TRAJ_INFO_FIELDS, EpisodeTracker, traj_info_stats

__all__ = [
    "ActionServerCollector",
    "ParallelCollector",
    "COLLECTOR_KINDS",
    "CollectorError",
    "EvalCollector",
    "EpisodeTracker",
    "PolicyStep",
    "SerialCollector",
    "TRAJ_INFO_FIELDS",
    "TorchRLCollector",
    "make_collector",
    "start_workers_early",
    "traj_info_stats",
]
