"""The sync trainer: rlpyt's ``MinibatchRl`` / ``MinibatchRlEval`` (and, on N ranks, ``SyncRl``) as an iterator.

The trainer owns the loop mechanics (iterations, weight sync to the collector, evaluation, log rows,
checkpoints, resume, the summary); the recipe's ``for`` body is the algorithm::

    for batch in trainer:                      # one [B, T] collector batch (already in the replay, if any)
        metrics = [updater.step(loss(replay.sample())) for _ in range(trainer.updates_due)]  # or update(batch)
        trainer.record(metrics, updates=len(metrics))

Semantics (rlpyt's ``runners/minibatch_rl.py``): the run collects at least ``n_steps`` frames, its iteration count
rounded **up** to whole iterations and then to whole log intervals (:func:`~tdrl.train.iteration_counts`), so the
run ends on a log row; rows, evaluations and checkpoints follow the iterations that complete an interval; an
``eval_collector`` also evaluates the untrained agent at iteration 0 (evaluation time is excluded from
``time/train_s`` and frames/s). ``updates_due`` is 0 before ``min_steps_learn``, then
:func:`~tdrl.train.updates_per_iteration`. ``trainer.itr`` is the 0-based iteration inside the body. Launching again
on the same run directory resumes bitwise after the last checkpoint, which holds the ``checkpoint_state`` objects,
every rank's collector (its envs, episodes in progress, recurrent state, worker RNGs) and RNGs, the evaluator's envs
and the open log interval's episodes and metrics; an interrupted run is closed without ``summary.json``. SIGTERM
stops the loop at the next iteration boundary, with a checkpoint (:attr:`Bookkeeper.sigterm`; on one rank:
data-parallel ranks stop at once).

Data parallel (rlpyt's SyncRl, ``trainer.kind=ddp``): every rank of a process group builds its own collector,
replay and model copy and runs this loop; ``modules`` (the loss module) start from rank 0's weights and their
gradients are averaged over the ranks after every backward pass (:mod:`tdrl.train.replicas`), so the replicas
stay bitwise equal (checked at every log row). No samples are exchanged; batch sizes are per rank (weak
scaling), while ``n_steps``, ``log_interval_steps``, ``min_steps_learn`` and the logged frames count all ranks.
Rank 0 evaluates, logs and checkpoints, with every rank's episodes and optimiser metrics in its rows.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from tensordict import TensorDictBase
from torch import nn

from tdrl.train.bookkeeping import (
    Bookkeeper,
    CheckpointObjects,
    book_counter,
    eval_collector_state,
    frames_per_batch,
    iteration_counts,
    load_eval_collector_state,
    updates_per_iteration,
)
from tdrl.train.protocols import Evaluator, Replay, RunLog
from tdrl.train.replicas import (
    GradientAllReduce,
    ReplicaDivergenceError,
    broadcast_from_main,
    broadcast_module_state,
    gather_to_main,
    replica_digest,
    tensor_digest,
)
from tdrl.utils.distributed import rank, world_size
from tdrl.utils.seeding import rng_state, set_rng_state
from tdrl.utils.stats import metrics_to_floats

if TYPE_CHECKING:  # annotations only: tdrl.collect imports torchrl.envs (~1 s)
    from tdrl.collect import Collector

__all__ = ["SyncTrainer", "iteration_counts", "updates_per_iteration"]


def shutdown(*collectors: Collector | Evaluator | None) -> None:
    for c in collectors:
        if c is not None:
            c.shutdown()


class SyncTrainer:
    """Alternate collection and optimisation with rlpyt's iteration, logging and evaluation semantics, on one
    process or on every rank of a process group (see the module docstring).

    Args:
        collector: a tdrl collector (``[B, T]`` batches, ``update_policy_weights_()``, ``traj_infos``,
            ``shutdown()``, ``state_dict()``); under ddp this rank's, seeded with ``rank_seed``.
        n_steps, log_interval_steps: env frames (all ranks) in total and between log rows (and evaluations).
        run: a ``tdrl.log.Run`` on rank 0 only; ``None`` keeps rows in :attr:`history` only.
        eval_collector: ``evaluate()`` returns whole greedy episodes, ``state_dict()``/``load_state_dict()`` carry
            its envs through checkpoints; ``None`` reports online training episodes.
        replay: off-policy replay buffer; every batch is ``replay.extend``-ed before the loop body runs.
        modules: the replicated modules (the loss module) whose gradients ddp averages; unused on one rank.
        log_traj_window: completed training episodes kept for online statistics.
        frames_per_itr: frames per collector batch (this rank's), when the collector does not say.
        replay_ratio, batch_size: off-policy data reuse and minibatch size (per rank): :attr:`updates_per_itr`.
        min_steps_learn: env frames collected before the first update.
        checkpoint_state: named objects with ``state_dict``/``load_state_dict`` (models, optimizers, updaters) or
            ``dumps``/``loads`` (replay buffers), saved in checkpoints and restored on resume. The trainer adds
            ``replay`` itself (as ``"replay"``), with the collector, evaluator and RNGs; policy parameters or
            buffers that no module here holds are named in a warning at start. Under ddp a
            replay's ``state_dict`` (counters) is saved per rank; its data stays in the rank's scratch directory.
            Those with ``check_finite()`` (updaters) are checked before every log row and checkpoint: an update
            skipped for a NaN/inf loss raises ``NonFiniteLossError`` there.
        checkpoint_interval_steps: env frames between checkpoints; 0 means at every log row.
        stop_return: stop early once the evaluation (or online) mean return reaches this (benchmarks).
    """

    def __init__(
        self,
        *,
        collector: Collector,
        n_steps: int,
        log_interval_steps: int,
        run: RunLog | None = None,
        eval_collector: Evaluator | None = None,
        replay: Replay | None = None,
        modules: Sequence[nn.Module] = (),
        log_traj_window: int = 100,
        frames_per_itr: int | None = None,
        replay_ratio: float | None = None,
        batch_size: int | None = None,
        min_steps_learn: int = 0,
        checkpoint_state: Mapping[str, Any] | None = None,
        checkpoint_interval_steps: int = 0,
        stop_return: float | None = None,
    ) -> None:
        self.rank, self.world_size = rank(), world_size()
        if run is not None and self.rank != 0:
            raise ValueError(f"rank {self.rank} was given a Run; open it on rank 0 only (tdrl.utils.distributed."
                             "is_main_process()) so one process owns the run directory")
        if (replay_ratio is None) != (batch_size is None):
            raise ValueError("replay_ratio and batch_size go together (updates per iteration need both)")
        self.collector = collector
        self.eval_collector = eval_collector if self.rank == 0 else None
        if self.rank != 0:
            shutdown(eval_collector)  # only rank 0 evaluates
        elif callable(follow := getattr(eval_collector, "follow", None)):
            follow(collector)  # evaluation sees observations as the collector's transform makes them
        self.replay = replay
        self.local_frames_per_itr = int(frames_per_itr or frames_per_batch(collector))
        self.frames_per_itr = self.local_frames_per_itr * self.world_size
        self.n_itr, self.log_interval_itrs = iteration_counts(n_steps, log_interval_steps, self.frames_per_itr)
        ckpt_itrs = int(checkpoint_interval_steps) // self.frames_per_itr
        self.checkpoint_interval_itrs = max(ckpt_itrs, 1) if checkpoint_interval_steps else self.log_interval_itrs
        self.min_itr_learn = int(min_steps_learn) // self.frames_per_itr
        self.updates_per_itr = updates_per_iteration(replay_ratio, self.local_frames_per_itr, batch_size) \
            if replay_ratio and batch_size is not None else 1  # batch_size is given with replay_ratio (checked above)
        self.objects = CheckpointObjects(self._owned_state(checkpoint_state, replay))
        if run is not None:
            self._warn_uncaptured(collector, self.objects)
        per_rank = {}
        if self.world_size > 1:  # each rank has its own replay: its counters go with the rank's state
            per_rank, self.objects.files = self.objects.files, {}
        self.rank_objects = CheckpointObjects(per_rank, files=False)
        self.stop_return = stop_return
        self.book = Bookkeeper(run=run, frames_per_itr=self.frames_per_itr, log_traj_window=log_traj_window,
                               update_batch_size=batch_size * self.world_size if batch_size else None)
        self.resumed = False
        self.stopped_early = False
        self._pending_trajs: list[dict[str, float]] = []  # this rank's episodes not yet gathered into a row
        self.modules = list(modules)
        self.grad_sync: GradientAllReduce | None = None
        if self.world_size > 1:
            if not self.modules:
                raise ValueError("modules: pass the replicated modules (e.g. the loss module) whose gradients to "
                                 "average over the ranks")
            broadcast_module_state(self.modules)  # every replica starts from rank 0's weights (DDP's constructor)
            self.grad_sync = GradientAllReduce(self.modules)

    @staticmethod
    def _owned_state(checkpoint_state: Mapping[str, Any] | None, replay: Replay | None) -> dict[str, Any]:
        """``checkpoint_state`` with the replay the trainer fills, under ``"replay"`` unless it is there already:
        the trainer owns what it needs to resume, whoever wrote the loop."""
        state = dict(checkpoint_state or {})
        if replay is None or any(obj is replay for obj in state.values()):
            return state
        if "replay" in state:
            raise ValueError("checkpoint_state['replay'] is another object than the trainer's replay; name it "
                             "differently (the trainer checkpoints its replay as 'replay')")
        return {**state, "replay": replay}

    @staticmethod
    def _warn_uncaptured(collector: Collector, objects: CheckpointObjects) -> None:
        """Name, once at start, what a resumed run would not get back: policy parameters or buffers (an
        exploration schedule's epsilon) that no ``checkpoint_state`` module holds."""
        policy = getattr(collector, "policy", None)
        if not isinstance(policy, nn.Module):
            return
        saved = {id(t) for obj in objects.states.values() if isinstance(obj, nn.Module)
                 for t in (*obj.parameters(), *obj.buffers())}
        missed = [name for name, t in (*policy.named_parameters(), *policy.named_buffers()) if id(t) not in saved]
        if missed:
            warnings.warn(f"checkpoint_state holds no module with the policy's {', '.join(missed[:4])}"
                          f"{' ...' if len(missed) > 4 else ''}: a resumed run would act with them as built; pass "
                          "the modules that own them (model, exploration) in checkpoint_state={...}", stacklevel=3)

    itr = book_counter("itr", "Collector iterations: the 0-based iteration inside the loop body, done ones outside.")
    frames = book_counter("frames", "Env frames collected (all ranks).")
    updates = book_counter("updates", "Gradient updates recorded.")
    history = book_counter("history", "Log rows (complete on rank 0; other ranks hold counters only).")

    @property
    def updates_due(self) -> int:
        """Gradient updates this iteration owes: 0 before ``min_steps_learn``, then ``updates_per_itr``."""
        return 0 if self.book.itr < self.min_itr_learn else self.updates_per_itr

    @property
    def summary(self) -> dict[str, Any]:
        """``summary.json`` content: frames, wall and train seconds, last evaluation, counters, learning curve."""
        return self.book.summary(stopped_early=self.stopped_early, world_size=self.world_size)

    def record(self, metrics: Any = None, *, updates: int = 0) -> None:
        """Store this iteration's optimiser metrics (a TensorDict/mapping or a list of them, summarised at the next
        log row as ``loss_x`` -> ``loss/x_mean``...) and count its gradient updates."""
        self.book.record(metrics, updates=updates)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along dim 0 (e.g. observations for global normalisation stats)."""
        if self.world_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    # --- The loop (log rows, evaluation and checkpoints are collective: every rank reaches them together) -----

    def __iter__(self) -> Iterator[TensorDictBase]:
        book = self.book
        completed = False
        book.start_session()
        try:
            self._maybe_resume()
            if book.itr == 0 and not self.resumed and broadcast_from_main(self.eval_collector is not None):
                if self.eval_collector is not None:
                    book.evaluate(self.eval_collector)
                self._log()  # rlpyt's MinibatchRlEval logs the untrained agent at iteration 0
            batches = iter(self.collector)
            first = True
            while book.itr < self.n_itr and not self.stopped_early:
                if not first and self.grad_sync is not None:  # rank 0's buffers (DDP's default)
                    broadcast_module_state(self.modules, params=False)
                # weights reach the collector's workers before every batch, also the first one after a resume
                self.collector.update_policy_weights_()
                batch = next(batches)
                if first:
                    self._warn_if_ranks_collect_the_same(batch)
                first = False
                book.frames += batch.numel() * self.world_size
                self._pending_trajs.extend(self.collector.traj_infos)
                if self.replay is not None:
                    self.replay.extend(batch)
                yield batch
                book.itr += 1
                if book.itr % self.log_interval_itrs == 0:
                    if self.eval_collector is not None:
                        book.evaluate(self.eval_collector)
                    self._log()
                    self._check_replicas()
                    stop = self.rank == 0 and book.reached(self.stop_return)
                    self.stopped_early = bool(broadcast_from_main(stop))
                final = book.itr >= self.n_itr or self.stopped_early
                if book.itr % self.checkpoint_interval_itrs == 0 or final or book.sigterm.requested:
                    self._save_checkpoint()
                book.sigterm.stop_here(final=final)
            completed = True
        finally:
            book.end_session()
            shutdown(self.collector, self.eval_collector)
            book.close_run(self.summary if completed else None)

    def _log(self) -> None:
        self.objects.check_finite()  # updates skipped for a NaN/inf loss since the last row raise here
        trajs, self._pending_trajs = self._pending_trajs, []
        if self.world_size == 1:
            self.book.add_episodes(trajs)
            self.book.log()
            return
        gathered = gather_to_main((trajs, metrics_to_floats(self.book.metrics)))
        self.book.metrics.clear()
        if self.rank != 0:
            return
        assert gathered is not None and self.grad_sync is not None  # rank 0 of several
        self.book.add_episodes([t for rank_trajs, _ in gathered for t in rank_trajs])
        reduce_s, self.grad_sync.reduce_s = self.grad_sync.reduce_s, 0.0
        # rank 0's all-reduce time includes waiting for the other ranks
        self.book.log({"time/allreduce_s": reduce_s}, metrics=[m for _, rank_m in gathered for m in rank_m])

    def _warn_if_ranks_collect_the_same(self, batch: TensorDictBase) -> None:
        if self.world_size == 1 or "observation" not in batch.keys():
            return
        digests = [None] * self.world_size
        dist.all_gather_object(digests, tensor_digest([batch["observation"]]))
        if len(set(digests)) == 1 and self.rank == 0:
            warnings.warn("every rank collected the same first batch: seed each rank's collector differently "
                          "(tdrl.utils.distributed.rank_seed), or the replicas average identical gradients",
                          stacklevel=3)

    def _check_replicas(self) -> None:
        if self.world_size == 1:
            return
        digests = [None] * self.world_size
        dist.all_gather_object(digests, replica_digest(self.modules, buffers=True))
        if len(set(digests)) != 1:
            raise ReplicaDivergenceError(
                f"the replicated modules differ across ranks at iteration {self.book.itr} (digests {digests}); "
                "something changed parameters outside the averaged optimizer step on some rank")

    # --- Checkpoints: shared objects from rank 0, every rank's own state gathered into rank 0's checkpoint ------

    def _save_checkpoint(self) -> None:
        self.objects.check_finite()
        mine = {**self.rank_objects.state_dict(), "collector": self.collector.state_dict(), "rng": rng_state(),
                "pending_trajs": list(self._pending_trajs), "metrics": metrics_to_floats(self.book.metrics)}
        self.book.save_checkpoint(self.objects, ranks=gather_to_main(mine), world_size=self.world_size,
                                  **eval_collector_state(self.eval_collector))

    def _maybe_resume(self) -> None:
        if self.resumed:
            return
        state = self.book.load_checkpoint(self.objects, share=broadcast_from_main)  # rank 0 reads, every rank restores
        if not state:
            return
        if state["world_size"] != self.world_size:
            raise ValueError(f"checkpoint was taken with world_size={state['world_size']}; this run has "
                             f"world_size={self.world_size}")
        mine = state["ranks"][self.rank]
        self.rank_objects.load_state_dict(mine)
        self.collector.load_state_dict(mine["collector"])
        load_eval_collector_state(self.eval_collector, state)
        set_rng_state(mine["rng"])
        self._pending_trajs = list(mine["pending_trajs"])
        self.book.metrics = list(mine.get("metrics", []))  # this rank's (the books hold rank 0's)
        self.resumed = True
