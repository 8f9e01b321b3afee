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
:func:`~tdrl.train.updates_per_iteration` (all of it set by a :class:`~tdrl.train.Schedule`). ``trainer.itr`` is the
0-based iteration inside the body. Launching again on the same run directory resumes bitwise after the last
checkpoint, which holds the ``checkpoint_state`` objects, every rank's collector (its envs, episodes in progress,
recurrent state, worker RNGs) and RNGs, the evaluator's envs and the open log interval's episodes and metrics; an
interrupted run is closed without ``summary.json``. SIGTERM stops the loop at the next iteration boundary, with a
checkpoint (:attr:`Bookkeeper.sigterm`; on one rank: data-parallel ranks stop at once).

On N ranks (rlpyt's SyncRl, ``trainer.kind=ddp``) the same loop runs as
:class:`~tdrl.distributed.data_parallel.DataParallelTrainer`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from tensordict import TensorDictBase
from torch import nn

from tdrl.train.bookkeeping import CheckpointObjects, frames_per_batch
from tdrl.train.core import TrainerCore
from tdrl.train.protocols import Evaluator, Replay, RunLog
from tdrl.train.schedule import Schedule, updates_per_iteration
from tdrl.utils.distributed import world_size
from tdrl.utils.seeding import rng_state, set_rng_state
from tdrl.utils.stats import metrics_to_floats

if TYPE_CHECKING:  # annotations only: tdrl.collect imports torchrl.envs (~1 s)
    from tdrl.collect import Collector

__all__ = ["SyncTrainer", "shutdown"]


def shutdown(*collectors: Collector | Evaluator | None) -> None:
    for c in collectors:
        if c is not None:
            c.shutdown()


class SyncTrainer(TrainerCore):
    """Alternate collection and optimisation with rlpyt's iteration, logging and evaluation semantics in one process
    (see the module docstring; :class:`~tdrl.train.core.TrainerCore` documents ``schedule``, ``run``,
    ``eval_collector``, ``replay``, ``checkpoint_state`` and ``log_traj_window``).

    Args:
        collector: a tdrl collector (``[B, T]`` batches, ``update_policy_weights_()``, ``traj_infos``,
            ``shutdown()``, ``state_dict()``). Every batch is ``replay.extend``-ed before the loop body runs; the
            collector's state goes into every checkpoint, and policy parameters or buffers that no
            ``checkpoint_state`` module holds are named in a warning at start.
        frames_per_itr: frames per collector batch, when the collector does not say.
    """

    world_size = 1

    def __init__(self, *, collector: Collector, schedule: Schedule, run: RunLog | None = None,
                 eval_collector: Evaluator | None = None, replay: Replay | None = None,
                 checkpoint_state: Mapping[str, Any] | None = None, log_traj_window: int = 100,
                 frames_per_itr: int | None = None) -> None:
        if self.world_size == 1 and world_size() > 1:
            raise ValueError(f"SyncTrainer runs in one process; this one is a rank of {world_size()}: use "
                             "tdrl.train.DataParallelTrainer (trainer.kind=ddp), which averages the gradients")
        self.collector = collector
        self.local_frames_per_itr = int(frames_per_itr or frames_per_batch(collector))
        batch_size = schedule.batch_size
        super().__init__(schedule=schedule, frames_per_itr=self.local_frames_per_itr * self.world_size, run=run,
                         eval_collector=eval_collector, checkpoint_state=checkpoint_state, replay=replay,
                         log_traj_window=log_traj_window,
                         update_batch_size=batch_size * self.world_size if batch_size else None)
        self.updates_per_itr = 1 if schedule.replay_ratio is None or batch_size is None else \
            updates_per_iteration(schedule.replay_ratio, self.local_frames_per_itr, batch_size)
        if callable(follow := getattr(self.eval_collector, "follow", None)):
            follow(collector)  # evaluation sees observations as the collector's transform makes them
        if run is not None:
            self._warn_uncaptured(collector, self.objects)
        self.rank_objects = CheckpointObjects({}, files=False)  # data parallel: each rank's replay counters
        self._pending_trajs: list[dict[str, float]] = []  # episodes not yet in a row

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

    @property
    def updates_due(self) -> int:
        """Gradient updates this iteration owes: 0 before ``min_steps_learn``, then ``updates_per_itr``."""
        return self.updates_per_itr if self.book.cadence.learning(self.book.itr) else 0

    def __iter__(self) -> Iterator[TensorDictBase]:
        return self._session(self._loop)

    def _loop(self) -> Iterator[TensorDictBase]:
        book = self.book
        batches = iter(self.collector)
        first = True
        while not self.stopped_early and book.itr < book.cadence.n_itr:
            self._before_batch(first)
            with book.timed("collect"):
                # weights reach the collector's workers before every batch, also the first one after a resume
                self.collector.update_policy_weights_()
                batch = next(batches)
            if first:
                self._check_first_batch(batch)
            first = False
            book.frames += batch.numel() * self.world_size
            self._pending_trajs.extend(self.collector.traj_infos)
            if self.replay is not None:
                with book.timed("extend"):
                    self.replay.extend(batch)
            yield from self._body(batch)
            book.itr += 1
            self._boundary()

    def _before_batch(self, first: bool) -> None:
        """Data parallel: rank 0's buffers reach every replica."""

    def _check_first_batch(self, batch: TensorDictBase) -> None:
        """Data parallel: warn when every rank collected the same data."""

    def _write_row(self) -> None:
        trajs, self._pending_trajs = self._pending_trajs, []
        self.book.add_episodes(trajs)
        super()._write_row()

    def _close(self) -> None:
        shutdown(self.collector, self.eval_collector)

    def _summary_extra(self) -> dict[str, Any]:
        return {"world_size": self.world_size}

    # --- Checkpoints: each rank's collector, RNGs and open interval, gathered into rank 0's ---------------------

    def _rank_state(self) -> dict[str, Any]:
        return {**self.rank_objects.state_dict(), "collector": self.collector.state_dict(), "rng": rng_state(),
                "pending_trajs": list(self._pending_trajs), "metrics": metrics_to_floats(self.book.metrics)}

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {"ranks": self._gather(self._rank_state()), "world_size": self.world_size}

    def _gather(self, state: dict[str, Any]) -> list[dict[str, Any]] | None:
        return [state]

    def _restore(self, state: Mapping[str, Any]) -> None:
        if state["world_size"] != self.world_size:
            raise ValueError(f"checkpoint was taken with world_size={state['world_size']}; this run has "
                             f"world_size={self.world_size}")
        mine = state["ranks"][self._rank]
        self.rank_objects.load_state_dict(mine)
        self.collector.load_state_dict(mine["collector"])
        set_rng_state(mine["rng"])
        self._pending_trajs = list(mine["pending_trajs"])
        self.book.metrics = list(mine.get("metrics", []))  # this rank's (the books hold rank 0's)

    _rank = 0
