"""Data parallel (rlpyt's SyncRl, ``trainer.kind=ddp``): the sync trainer's loop on every rank of a process group.

Every rank builds its own collector, replay and model copy and runs the loop; ``modules`` (the loss module) start
from rank 0's weights and their gradients are averaged over the ranks after every backward pass
(:mod:`tdrl.distributed.replicas`), so the replicas stay bitwise equal (checked at every log row). No samples are
exchanged; batch sizes are per rank (weak scaling), while ``n_steps``, ``log_interval_steps``, ``min_steps_learn``
and the logged frames count all ranks. Rank 0 evaluates, logs and checkpoints, with every rank's episodes,
optimiser metrics, collector and RNG states in its rows and checkpoints; log rows, evaluations and checkpoints are
collective (every rank reaches them together). SIGTERM stops the ranks at once (they would have to agree on the
boundary).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from tensordict import TensorDictBase
from torch import nn

from tdrl.distributed.replicas import (
    GradientAllReduce,
    ReplicaDivergenceError,
    broadcast_from_main,
    broadcast_module_state,
    gather_to_main,
    replica_digest,
    tensor_digest,
)
from tdrl.train.bookkeeping import CheckpointObjects
from tdrl.train.protocols import Evaluator, Replay, RunLog
from tdrl.train.schedule import Schedule
from tdrl.train.sync import SyncTrainer, shutdown
from tdrl.utils.distributed import rank, world_size
from tdrl.utils.stats import metrics_to_floats

if TYPE_CHECKING:
    from tdrl.collect import Collector

__all__ = ["DataParallelTrainer"]


class DataParallelTrainer(SyncTrainer):
    """:class:`~tdrl.train.SyncTrainer` on every rank of the process group (module docstring); its arguments, with
    ``collector`` this rank's (seeded with ``rank_seed``), ``run`` on rank 0 only, batch sizes per rank, and:

    Args:
        modules: the replicated modules (the loss module) whose gradients are averaged over the ranks.
    """

    def __init__(self, *, collector: Collector, schedule: Schedule, modules: Sequence[nn.Module],
                 run: RunLog | None = None, eval_collector: Evaluator | None = None, replay: Replay | None = None,
                 checkpoint_state: Mapping[str, Any] | None = None, log_traj_window: int = 100,
                 frames_per_itr: int | None = None) -> None:
        self._rank, self.world_size = rank(), world_size()
        if run is not None and self._rank != 0:
            raise ValueError(f"rank {self._rank} was given a Run; open it on rank 0 only (tdrl.utils.distributed."
                             "is_main_process()) so one process owns the run directory")
        if not modules:
            raise ValueError("modules: pass the replicated modules (e.g. the loss module) whose gradients to "
                             "average over the ranks")
        if self._rank != 0:
            shutdown(eval_collector)  # only rank 0 evaluates
            eval_collector = None
        super().__init__(collector=collector, schedule=schedule, run=run, eval_collector=eval_collector,
                         replay=replay, checkpoint_state=checkpoint_state, log_traj_window=log_traj_window,
                         frames_per_itr=frames_per_itr)
        # each rank has its own replay: its counters go with the rank's state, its data stays in its directory
        self.rank_objects, self.objects.files = CheckpointObjects(self.objects.files, files=False), {}
        self.modules = list(modules)
        broadcast_module_state(self.modules)  # every replica starts from rank 0's weights (DDP's constructor)
        self.grad_sync = GradientAllReduce(self.modules)

    def _agree(self, value: bool) -> bool:
        return bool(broadcast_from_main(value if self._rank == 0 else False))

    _share = staticmethod(broadcast_from_main)  # rank 0 reads the checkpoint, every rank restores

    def _gather(self, state: dict[str, Any]) -> list[dict[str, Any]] | None:
        return gather_to_main(state)

    def _before_batch(self, first: bool) -> None:
        if not first:
            broadcast_module_state(self.modules, params=False)  # rank 0's buffers (DDP's default)

    def _check_first_batch(self, batch: TensorDictBase) -> None:
        if "observation" not in batch.keys():
            return
        digests = [None] * self.world_size
        dist.all_gather_object(digests, tensor_digest([batch["observation"]]))
        if len(set(digests)) == 1 and self._rank == 0:
            warnings.warn("every rank collected the same first batch: seed each rank's collector differently "
                          "(tdrl.utils.distributed.rank_seed), or the replicas average identical gradients",
                          stacklevel=4)

    def _write_row(self) -> None:
        self.objects.check_finite()  # updates skipped for a NaN/inf loss since the last row raise here
        trajs, self._pending_trajs = self._pending_trajs, []
        gathered = gather_to_main((trajs, metrics_to_floats(self.book.metrics)))
        self.book.metrics.clear()
        if self._rank == 0:
            assert gathered is not None  # rank 0
            self.book.add_episodes([t for rank_trajs, _ in gathered for t in rank_trajs])
            reduce_s, self.grad_sync.reduce_s = self.grad_sync.reduce_s, 0.0
            # rank 0's all-reduce time includes waiting for the other ranks
            self.book.log({"time/allreduce_s": reduce_s}, metrics=[m for _, rank_m in gathered for m in rank_m])
        self._check_replicas()

    def _check_replicas(self) -> None:
        digests = [None] * self.world_size
        dist.all_gather_object(digests, replica_digest(self.modules, buffers=True))
        if len(set(digests)) != 1:
            raise ReplicaDivergenceError(
                f"the replicated modules differ across ranks at iteration {self.book.itr} (digests {digests}); "
                "something changed parameters outside the averaged optimizer step on some rank")
