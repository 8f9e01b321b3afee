"""Trainers: loop mechanics around a recipe's visible update (rlpyt's runners). :class:`SyncTrainer` is rlpyt's
MinibatchRl(Eval) and, on the ranks :func:`launch_data_parallel` starts, its SyncRl; :class:`AsyncTrainer` is its
AsyncRl; :class:`RayTrainer` spreads the collectors over a Ray cluster (Ape-X, IMPALA); all keep their books in a
:class:`Bookkeeper`. :func:`make_trainer` picks one by ``trainer.kind``.
"""

from tdrl.train.async_ import AsyncTrainer, AsyncTrainerError
from tdrl.train.bookkeeping import Bookkeeper, iteration_counts, updates_per_iteration
from tdrl.train.ddp_launch import DataParallelError, launch_data_parallel
from tdrl.train.factory import (
    TrainerConfig,
    check_min_steps_learn,
    check_trainer,
    collector_factory_from,
    eval_collector_from,
    make_trainer,
    prepare_off_policy,
    prepare_recipe,
    transition_replay_from,
)
from tdrl.train.ray_actors import RayTrainerError
from tdrl.train.ray_trainer import RayTrainer, module_path
from tdrl.train.sync import SyncTrainer
from tdrl.utils.keys import VERSION_KEY

__all__ = ["AsyncTrainer", "AsyncTrainerError", "Bookkeeper", "DataParallelError", "RayTrainer", "RayTrainerError",
           "SyncTrainer", "TrainerConfig", "VERSION_KEY", "check_min_steps_learn", "check_trainer",
           "collector_factory_from", "eval_collector_from", "iteration_counts", "launch_data_parallel",
           "make_trainer", "module_path", "prepare_off_policy", "prepare_recipe", "transition_replay_from",
           "updates_per_iteration"]
