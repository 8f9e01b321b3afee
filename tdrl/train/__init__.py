"""Trainers: loop mechanics around a recipe's visible update (rlpyt's runners).

``SyncTrainer`` is rlpyt's MinibatchRl/MinibatchRlEval: collect a ``[B, T]`` batch, let the recipe update,
log/evaluate/checkpoint at intervals. See :mod:`tdrl.train.sync` for the API and semantics.

``DataParallelTrainer`` is rlpyt's SyncRl (one replica per process, gradients all-reduced, :mod:`tdrl.train.ddp`),
``AsyncTrainer`` its AsyncRl (collector process + optimizer on a shared replay, :mod:`tdrl.train.async_`);
``make_trainer``/``TrainerConfig`` pick one by ``trainer.kind`` (:mod:`tdrl.train.factory`).
"""

from tdrl.train.stats import episode_stats, scalar_stats
from tdrl.train.sync import SyncTrainer, iteration_counts, updates_per_iteration

__all__ = ["SyncTrainer", "episode_stats", "iteration_counts", "scalar_stats", "updates_per_iteration"]

from tdrl.train.async_ import AsyncTrainer, AsyncTrainerError  # noqa: E402
from tdrl.train.ddp import DataParallelError, DataParallelTrainer, launch_data_parallel  # noqa: E402
from tdrl.train.factory import TrainerConfig, check_min_steps_learn, check_trainer, make_trainer  # noqa: E402

__all__ += [
    "AsyncTrainer",
    "AsyncTrainerError",
    "DataParallelError",
    "DataParallelTrainer",
    "TrainerConfig",
    "check_min_steps_learn",
    "check_trainer",
    "launch_data_parallel",
    "make_trainer",
]
