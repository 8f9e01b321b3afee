"""The scale-out layer: trainers that span the processes of a ``torch.distributed`` group or the machines of a Ray
cluster, built on :class:`tdrl.train.TrainerCore` like the one-machine trainers.

- Data parallel (rlpyt's SyncRl, ``trainer.kind=ddp``): :class:`DataParallelTrainer` on every rank, started by
  :func:`launch_data_parallel` (local processes) or by torchrun/SLURM; gradients averaged by
  :mod:`~tdrl.distributed.replicas`.
- Ray (``trainer.kind=ray``: Ape-X, IMPALA): :class:`RayTrainer`, its collector actors
  (:mod:`~tdrl.distributed.ray_actors`) and their pool with spares (:mod:`~tdrl.distributed.actor_pool`), configured
  by :class:`tdrl.config.RayConfig` and :class:`ActorHooks`.

SLURM's side (the multi-task job's rendezvous, a Ray cluster over a job's nodes) is :mod:`tdrl.launch`'s, which
starts recipes by path and never imports this layer.
"""

from tdrl.distributed.data_parallel import DataParallelTrainer
from tdrl.distributed.ddp_launch import DataParallelError, launch_data_parallel
from tdrl.distributed.ray_actors import RayTrainerError
from tdrl.distributed.ray_trainer import ActorHooks, RayTrainer, module_path

__all__ = ["ActorHooks", "DataParallelError", "DataParallelTrainer", "RayTrainer", "RayTrainerError",
           "launch_data_parallel", "module_path"]
