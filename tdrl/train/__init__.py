"""Trainers on one machine: loop mechanics around a recipe's visible update (rlpyt's runners). :class:`SyncTrainer`
is rlpyt's MinibatchRl(Eval), :class:`AsyncTrainer` its AsyncRl. Both are a :class:`TrainerCore` (one schedule,
boundary, resume and summary) around their own way of getting data, and keep their books in a :class:`Bookkeeper`;
a :class:`Schedule` says when. The trainers that span processes of a group or machines of a cluster (data parallel,
Ray) are :mod:`tdrl.distributed`'s; :func:`tdrl.wiring.make_trainer` picks one by ``trainer.kind``.
"""

from tdrl.train.async_ import AsyncTrainer, AsyncTrainerError
from tdrl.train.bookkeeping import Bookkeeper
from tdrl.train.core import TrainerCore
from tdrl.train.schedule import Cadence, Schedule, iteration_counts, updates_per_iteration
from tdrl.train.sync import SyncTrainer
from tdrl.utils.keys import VERSION_KEY

__all__ = ["AsyncTrainer", "AsyncTrainerError", "Bookkeeper", "Cadence", "Schedule", "SyncTrainer", "TrainerCore",
           "VERSION_KEY", "iteration_counts", "updates_per_iteration"]
