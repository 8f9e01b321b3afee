"""Data-parallel trainer: one full collector-learner replica per process, gradients all-reduced (rlpyt's SyncRl).

Each rank builds its own collector, replay and model copy (the recipe's ``main`` runs once per rank), collects
its own ``[B, T]`` batches and computes gradients on them; the gradients of the replicated modules are averaged
over the ranks at the end of every backward pass, so every rank takes the same optimizer step and the models stay
identical (bitwise: every rank receives the same reduced bytes and runs the same deterministic step). No samples
are exchanged. Batch sizes are per rank (weak scaling): N ranks collect ``N * B * T`` frames per iteration and
each update averages ``N`` minibatches, as in rlpyt. Rank 0 evaluates, logs and checkpoints; the episode
statistics and optimiser metrics of every rank are gathered into its rows.

Starting the ranks::

    def main(cfg):                                   # the recipe
        if cfg.trainer.kind == "ddp" and not is_distributed():
            return launch_data_parallel(main, cfg, world_size=cfg.trainer.world_size)
        seed_everything(rank_seed(cfg.run.seed))     # distinct collector/env streams per rank
        run = Run.open(...) if is_main_process() else None
        ...build collector, loss, updater...
        trainer = DataParallelTrainer(collector=collector, modules=[loss], run=run, n_steps=..., ...)
        for batch in trainer:                        # the same loop body as with SyncTrainer
            metrics = update(batch)
            trainer.record(metrics, updates=n)

:func:`launch_data_parallel` spawns ``world_size`` local processes (gloo on CPU, NCCL on GPU, one GPU per rank),
or, when torch's ``env://`` variables are set (torchrun; ``tdrl.launch`` exports them for multi-task SLURM jobs),
joins that process group and runs ``main`` in this process. A rank that raises or dies stops the others and the
launcher raises :class:`DataParallelError` with that rank's traceback.

Gradients are averaged by parameter hooks (:mod:`tdrl.train.replicas` says why not ``DistributedDataParallel``);
the ranks are started by :mod:`tdrl.train.ddp_launch`.

What "equal to a single process" means: for a loss that is a mean over the minibatch, the averaged gradient of N
equal-size per-rank minibatches equals the gradient of their concatenation up to float summation order (tested
to 1e-6). Whole runs are not equal to a single-process run: each rank draws its own env and sampling streams, and
per-minibatch statistics (PPO's advantage normalisation) are computed per rank.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDictBase
from torch import nn

from tdrl.train.bookkeeping import (
    Bookkeeper,
    CheckpointObjects,
    frames_per_batch,
    iteration_counts,
    updates_per_iteration,
)
from tdrl.train.ddp_launch import DataParallelError, launch_data_parallel
from tdrl.train.replicas import (
    GradientAllReduce,
    broadcast_from_main,
    broadcast_module_state,
    gather_to_main,
    replica_digest,
)
from tdrl.train.sync import shutdown
from tdrl.utils.distributed import rank, world_size
from tdrl.utils.seeding import rng_state, set_rng_state
from tdrl.utils.stats import metrics_to_floats

__all__ = [
    "DataParallelError",
    "DataParallelTrainer",
    "GradientAllReduce",
    "ReplicaDivergenceError",
    "broadcast_module_state",
    "launch_data_parallel",
    "replica_digest",
]


class ReplicaDivergenceError(RuntimeError):
    """The replicated modules differ across ranks (a step was not averaged, or a rank changed them alone)."""


# --- The trainer ------------------------------------------------------------------------------------------------


class DataParallelTrainer:
    """rlpyt's SyncRl/SyncRlEval: SyncTrainer's loop on every rank, gradients averaged, rank 0 keeping the books.

    Construct it on every rank (inside the process group made by :func:`launch_data_parallel`, torchrun or a
    SLURM launch); the recipe's loop body is unchanged from :class:`~tdrl.train.SyncTrainer`. Counting follows
    rlpyt's SyncRl: ``n_steps``, ``log_interval_steps``, ``min_steps_learn`` and the logged frames are totals over
    all ranks; ``batch_size`` and the collector's ``B x T`` are per rank.

    Args:
        collector: this rank's collector (seed it with :func:`tdrl.utils.distributed.rank_seed`).
        modules: the replicated modules (the loss module): rank 0's parameters and buffers are copied to every
            rank now, their gradients are averaged after every backward pass, and their parameters are checked
            for bitwise equality at every log row.
        n_steps: total env frames over all ranks.
        log_interval_steps: env frames (all ranks) between log rows, evaluations and checkpoints.
        run: rank 0's ``tdrl.log.Run``; must be ``None`` on the other ranks.
        eval_collector: evaluation collector, used on rank 0 only (other ranks may pass ``None``).
        replay: off-policy replay buffer of this rank; every batch is ``replay.extend``-ed before the loop body.
        log_traj_window: completed episodes (all ranks) kept for online statistics.
        frames_per_itr: this rank's frames per collector batch, when the collector does not say.
        replay_ratio: off-policy data reuse; with ``batch_size`` it sets :attr:`updates_per_itr`.
        batch_size: per-rank minibatch size of one gradient update.
        min_steps_learn: env frames (all ranks) before the first update.
        checkpoint_state: objects identical on every rank (models, optimizers, updaters): saved from rank 0 and
            loaded on every rank on resume.
        rank_state: objects that differ per rank (schedules fed by local data...), with
            ``state_dict``/``load_state_dict``: every rank's state is gathered into rank 0's checkpoint. Objects
            of ``checkpoint_state`` that write their own files (replay buffers: ``dumps``/``loads``) are moved
            here: their ``state_dict`` (counters; the data stays in each rank's scratch directory) is per rank.
        checkpoint_interval_steps: env frames between checkpoints; 0 means at every log row.
        stop_return: stop once the evaluation (or online) mean return reaches this.
        broadcast_buffers: after every iteration copy rank 0's buffers of ``modules`` to all ranks (DDP's default;
            e.g. observation-normalisation statistics). Gather the data first (:meth:`all_gather`) to build
            statistics from every rank's batch.
    """

    def __init__(
        self,
        *,
        collector: Any,
        modules: Sequence[nn.Module],
        n_steps: int,
        log_interval_steps: int,
        run: Any = None,
        eval_collector: Any = None,
        replay: Any = None,
        log_traj_window: int = 100,
        frames_per_itr: int | None = None,
        replay_ratio: float | None = None,
        batch_size: int | None = None,
        min_steps_learn: int = 0,
        checkpoint_state: Mapping[str, Any] | None = None,
        rank_state: Mapping[str, Any] | None = None,
        checkpoint_interval_steps: int = 0,
        stop_return: float | None = None,
        broadcast_buffers: bool = True,
    ) -> None:
        self.rank, self.world_size = rank(), world_size()
        if run is not None and self.rank != 0:
            raise ValueError(f"rank {self.rank} was given a Run; open it on rank 0 only (tdrl.utils.distributed."
                             "is_main_process()) so one process owns the run directory")
        if (replay_ratio is None) != (batch_size is None):
            raise ValueError("replay_ratio and batch_size go together (updates per iteration need both)")
        self.collector = collector
        self.eval_collector = eval_collector if self.rank == 0 else None
        self.replay = replay
        if self.rank != 0:
            shutdown(eval_collector)  # only rank 0 evaluates
        self.modules = list(modules)
        if not self.modules:
            raise ValueError("modules: pass the replicated modules (e.g. the loss module) whose gradients to average")
        self.local_frames_per_itr = int(frames_per_itr or frames_per_batch(collector))
        self.frames_per_itr = self.local_frames_per_itr * self.world_size
        self.n_itr, self.log_interval_itrs = iteration_counts(n_steps, log_interval_steps, self.frames_per_itr)
        self.min_itr_learn = int(min_steps_learn) // self.frames_per_itr
        self.batch_size = batch_size
        self.updates_per_itr = (
            updates_per_iteration(replay_ratio, self.local_frames_per_itr, batch_size) if replay_ratio else 1
        )
        ckpt_itrs = max(int(checkpoint_interval_steps) // self.frames_per_itr, 1) if checkpoint_interval_steps else 0
        self.checkpoint_interval_itrs = ckpt_itrs or self.log_interval_itrs
        shared = CheckpointObjects(checkpoint_state)
        self.objects = CheckpointObjects(shared.states)
        # replay buffers: each rank has its own, and saves only its counters
        self.rank_objects = CheckpointObjects({**(rank_state or {}), **shared.files}, files=False)
        self.stop_return = stop_return
        self.broadcast_buffers = broadcast_buffers
        self.book = Bookkeeper(run=run, frames_per_itr=self.frames_per_itr, log_traj_window=log_traj_window,
                               update_batch_size=batch_size * self.world_size if batch_size else None)
        self.resumed = False
        self.stopped_early = False
        self._pending_trajs: list[dict[str, float]] = []  # this rank's episodes not yet gathered into a row
        broadcast_module_state(self.modules)  # every replica starts from rank 0's weights (DDP's constructor)
        self.grad_sync = GradientAllReduce(self.modules)

    # --- what the recipe reads ------------------------------------------------------------------------------

    @property
    def itr(self) -> int:
        return self.book.itr

    @property
    def frames(self) -> int:
        """Env frames collected by all ranks."""
        return self.book.frames

    @property
    def updates(self) -> int:
        return self.book.updates

    @property
    def history(self) -> list[dict[str, float]]:
        """Log rows (complete on rank 0; other ranks hold counters only)."""
        return self.book.history

    @property
    def updates_due(self) -> int:
        """Gradient updates this iteration owes (the same on every rank)."""
        return 0 if self.book.itr < self.min_itr_learn else self.updates_per_itr

    @property
    def summary(self) -> dict[str, Any]:
        return self.book.summary(stopped_early=self.stopped_early, world_size=self.world_size)

    def record(self, metrics: Any = None, *, updates: int = 0) -> None:
        """Store this iteration's optimiser metrics (gathered from every rank at the next row); count updates."""
        self.book.record(metrics, updates=updates)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along dim 0 (e.g. observations for global normalisation stats)."""
        if self.world_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    # --- the loop -----------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[TensorDictBase]:
        completed = False
        self.book.start_session()
        try:
            self._maybe_resume()
            if self.eval_collector is not None and self.book.itr == 0 and not self.resumed:
                self.book.evaluate(self.eval_collector)
            if self._has_eval() and self.book.itr == 0 and not self.resumed:
                self._log()
            batches = iter(self.collector)
            first = True
            while self.book.itr < self.n_itr and not self.stopped_early:
                if not first and self.broadcast_buffers:
                    broadcast_module_state(self.modules, params=False)
                # weights reach the collector's workers before every batch, also the first one after a resume
                self.collector.update_policy_weights_()
                batch = next(batches)
                if first:
                    self._warn_if_ranks_collect_the_same(batch)
                first = False
                self.book.frames += batch.numel() * self.world_size
                self._pending_trajs.extend(self.collector.traj_infos)
                if self.replay is not None:
                    self.replay.extend(batch)
                yield batch
                self.book.itr += 1
                itr = self.book.itr
                if itr % self.log_interval_itrs == 0:
                    if self.eval_collector is not None:
                        self.book.evaluate(self.eval_collector)
                    self._log()
                    self._check_replicas()
                    self._check_stop()
                if itr % self.checkpoint_interval_itrs == 0 or itr >= self.n_itr or self.stopped_early:
                    self._save_checkpoint()
            completed = True
        finally:
            self.book.end_session()
            shutdown(self.collector, self.eval_collector)
            self.book.close_run(self.summary if completed else None)

    def _has_eval(self) -> bool:
        """Whether rank 0 evaluates (all ranks must agree, since logging is collective)."""
        return bool(broadcast_from_main(self.eval_collector is not None))

    def _warn_if_ranks_collect_the_same(self, batch: TensorDictBase) -> None:
        if self.world_size == 1 or "observation" not in batch.keys():
            return
        obs = batch["observation"].contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
        digest = hashlib.blake2b(obs.tobytes(), digest_size=16).hexdigest()
        digests = [None] * self.world_size
        dist.all_gather_object(digests, digest)
        if len(set(digests)) == 1 and self.rank == 0:
            warnings.warn("every rank collected the same first batch: seed each rank's collector differently "
                          "(tdrl.utils.distributed.rank_seed), or the replicas average identical gradients",
                          stacklevel=3)

    # --- rows, evaluation, checkpoints (collective: every rank calls them at the same iterations) ---------------

    def _log(self) -> None:
        local = (self._pending_trajs, metrics_to_floats(self.book.metrics))
        self._pending_trajs = []
        self.book.metrics.clear()
        gathered = gather_to_main(local)
        if self.rank != 0:
            self.book.new_trajs.clear()
            return
        trajs = [t for rank_trajs, _ in gathered for t in rank_trajs]
        metrics = [m for _, rank_metrics in gathered for m in rank_metrics]
        self.book.add_episodes(trajs)
        reduce_s, self.grad_sync.reduce_s = self.grad_sync.reduce_s, 0.0
        self.book.log({"time/allreduce_s": reduce_s}, metrics=metrics)  # rank 0's, incl. waiting for the others

    def _check_replicas(self) -> None:
        if self.world_size == 1:
            return
        digests = [None] * self.world_size
        dist.all_gather_object(digests, replica_digest(self.modules, buffers=self.broadcast_buffers))
        if len(set(digests)) != 1:
            raise ReplicaDivergenceError(
                f"the replicated modules differ across ranks at iteration {self.book.itr} (digests {digests}); "
                "something changed parameters outside the averaged optimizer step on some rank"
            )

    def _check_stop(self) -> None:
        self.stopped_early = bool(broadcast_from_main(self.rank == 0 and self.book.reached(self.stop_return)))

    def _rank_checkpoint(self) -> dict[str, Any]:
        state = self.rank_objects.state_dict()
        state["collector"] = self.collector.state_dict()
        state["rng"] = rng_state()
        state["pending_trajs"] = list(self._pending_trajs)
        return state

    def _save_checkpoint(self) -> None:
        self.book.save_checkpoint(self.objects, ranks=gather_to_main(self._rank_checkpoint()),
                                  world_size=self.world_size)

    def _maybe_resume(self) -> None:
        state = None
        if self.book.run is not None and not self.resumed:
            state = self.book.run.load_checkpoint()
        state = broadcast_from_main(state)
        if not state:
            return
        if state["world_size"] != self.world_size:
            raise ValueError(f"checkpoint was taken with world_size={state['world_size']}; this run has "
                             f"world_size={self.world_size}")
        self.book.load_state_dict(state["trainer"])
        self.objects.load_state_dict(state)
        mine = state["ranks"][self.rank]
        self.rank_objects.load_state_dict(mine)
        self.collector.load_state_dict(mine["collector"])
        set_rng_state(mine["rng"])
        self._pending_trajs = list(mine["pending_trajs"])
        self.resumed = True

