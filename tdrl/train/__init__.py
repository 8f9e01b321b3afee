"""Trainers: loop mechanics around a recipe's visible update (rlpyt's runners). :class:`SyncTrainer` is rlpyt's
MinibatchRl(Eval) and :class:`DataParallelTrainer`, on the ranks :func:`launch_data_parallel` starts, its SyncRl;
:class:`AsyncTrainer` is its AsyncRl; :class:`RayTrainer` spreads the collectors over a Ray cluster (Ape-X, IMPALA).
All three are a :class:`TrainerCore` (one schedule, boundary, resume and summary) around their own way of getting
data, and keep their books in a :class:`Bookkeeper`; a :class:`Schedule` says when. :func:`make_trainer` picks one
by ``trainer.kind``.
"""

from tdrl.train.async_ import AsyncTrainer, AsyncTrainerError
from tdrl.train.bookkeeping import Bookkeeper
from tdrl.train.core import TrainerCore
from tdrl.train.data_parallel import DataParallelTrainer
from tdrl.train.ddp_launch import DataParallelError, launch_data_parallel
from tdrl.train.factory import (
    Trainer,
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
from tdrl.train.ray_trainer import ActorHooks, RayTrainer, module_path
from tdrl.train.schedule import Cadence, Schedule, iteration_counts, updates_per_iteration
from tdrl.train.sync import SyncTrainer
from tdrl.utils.keys import VERSION_KEY

__all__ = ["ActorHooks", "AsyncTrainer", "AsyncTrainerError", "Bookkeeper", "Cadence", "DataParallelError",
           "DataParallelTrainer", "RayTrainer", "RayTrainerError", "Schedule", "SyncTrainer", "Trainer",
           "TrainerConfig", "TrainerCore", "VERSION_KEY", "check_min_steps_learn", "check_trainer",
           "collector_factory_from", "eval_collector_from", "iteration_counts", "launch_data_parallel",
           "make_trainer", "module_path", "prepare_off_policy", "prepare_recipe", "transition_replay_from",
           "updates_per_iteration"]
