"""Trainers: loop mechanics around a recipe's visible update (rlpyt's runners), one core for all three.

``SyncTrainer`` is rlpyt's MinibatchRl/MinibatchRlEval and, on the ranks of a process group started by
:func:`launch_data_parallel`, its SyncRl (one replica per process, gradients all-reduced; :mod:`tdrl.train.sync`);
``AsyncTrainer`` is its AsyncRl (collector process + optimizer on a shared replay, :mod:`tdrl.train.async_`). Both
keep their counters, rows, evaluation and checkpoints in a :class:`~tdrl.train.bookkeeping.Bookkeeper`.
``make_trainer``/``TrainerConfig`` pick one by ``trainer.kind`` (:mod:`tdrl.train.factory`).
"""

from tdrl.train.async_ import AsyncTrainer, AsyncTrainerError
from tdrl.train.bookkeeping import Bookkeeper, iteration_counts, updates_per_iteration
from tdrl.train.ddp_launch import DataParallelError, launch_data_parallel
from tdrl.train.factory import TrainerConfig, check_min_steps_learn, check_trainer, make_trainer
from tdrl.train.sync import SyncTrainer

__all__ = [
    "AsyncTrainer",
    "AsyncTrainerError",
    "Bookkeeper",
    "DataParallelError",
    "SyncTrainer",
    "TrainerConfig",
    "check_min_steps_learn",
    "check_trainer",
    "iteration_counts",
    "launch_data_parallel",
    "make_trainer",
    "updates_per_iteration",
]
