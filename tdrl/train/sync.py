"""The sync trainer: rlpyt's ``MinibatchRl`` / ``MinibatchRlEval`` as an iterator the recipe loops over.

Collection and optimisation alternate in one process. The trainer owns the loop mechanics (iteration count,
weight sync to the collector, evaluation cadence, logging and checkpoint calls, resume, the summary); the recipe
owns the algorithm, which stays visible in its ``for`` body::

    trainer = SyncTrainer(collector=collector, run=run, n_steps=100_000, log_interval_steps=10_000,
                          eval_collector=eval_collector,
                          checkpoint_state={"model": actor_critic, "updater": updater})
    for batch in trainer:                  # one collector batch, [B, T]; eval/log/checkpoint happen around it
        metrics = update(batch)            # the algorithm
        trainer.record(metrics, updates=n_updates)
    summary = trainer.summary              # {"frames", "wall_s", "eval/return_mean", ...}

Off-policy recipes ask the trainer how many gradient updates this iteration owes (rlpyt's ``replay_ratio`` and
``min_steps_learn``)::

    trainer = SyncTrainer(..., replay=replay, replay_ratio=8, batch_size=256, min_steps_learn=1_000)
    for _ in trainer:                          # the trainer put the batch into the replay
        for _ in range(trainer.updates_due):   # 0 before min_steps_learn, then updates_per_itr
            metrics.append(updater.step(loss(replay.sample())))

Semantics (rlpyt, ``runners/minibatch_rl.py``):
    * ``frames_per_itr = B * T`` of one collector batch. ``n_itr = n_steps // frames_per_itr``;
      ``log_interval_itrs = max(log_interval_steps // frames_per_itr, 1)``; ``n_itr`` is rounded **up** to a
      multiple of ``log_interval_itrs`` so the run ends on a log row.
    * Logging, evaluation and checkpoints happen after iteration ``itr`` when ``(itr + 1) % log_interval_itrs
      == 0``. With an ``eval_collector`` (MinibatchRlEval) the agent is also evaluated before the first
      iteration (iteration 0); evaluation time is excluded from ``time/train_s`` and from frames/s.
    * Without an eval collector (MinibatchRl) episode statistics are online: the last ``log_traj_window``
      (100) completed training episodes.
    * ``updates_per_itr = max(1, round(replay_ratio * frames_per_itr / batch_size))`` and no updates while
      ``itr < min_steps_learn // frames_per_itr``.
    * ``collector.update_policy_weights_()`` is called before every batch (the recipe's update reaches the
      collector's workers); ``trainer.itr`` is the 0-based iteration inside the loop body, so schedules read
      ``lr_at(trainer.itr)`` (PPO's linear decay) or ``eps_at(trainer.frames)``.
    * Checkpoints are taken at log boundaries (or every ``checkpoint_interval_steps``) and hold every object in
      ``checkpoint_state`` (``state_dict``/``load_state_dict``; objects with ``dumps(dir)``/``loads(dir)``, such
      as replay buffers, go through the Run's extra writers), the collector's state and the trainer's counters
      and episode window; the Run adds the RNG states and its logger position. Launching again on the same run
      directory resumes at the iteration after the last checkpoint, without re-evaluating iteration 0.

Log rows go to ``run.log(metrics, step=frames, iteration=, updates=, update_batch_size=, episodes=)`` (the Run
computes rlpyt's Iteration/CumSteps/CumTime/StepsPerSecond/CumUpdates/ReplayRatio columns); metrics are
``train/<field>_{mean,std,median,min,max}`` over the episode window, ``eval/...`` over the last evaluation,
five statistics per recorded optimiser metric (``loss/objective_mean``...), ``time/train_s`` and ``time/eval_s``.
The summary adds ``train_s``, counters and ``curve`` (``[{frames, train_s, return_mean}]`` per log row).

The ``run`` (``tdrl.log.Run``) is optional: without one the trainer keeps its log rows in :attr:`history` only,
which is what the unit tests use. The collector follows tdrl's collector protocol (iteration,
``update_policy_weights_()``, ``traj_infos``, ``shutdown()``, ``state_dict()``); the eval collector is
:func:`tdrl.collect.make_eval_collector`'s (``evaluate()`` returns whole greedy episodes). The trainer shuts both
down when the loop ends, however it ends; an interrupted run is closed without ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tensordict import TensorDictBase

from tdrl.train.bookkeeping import (
    Bookkeeper,
    CheckpointObjects,
    frames_per_batch,
    iteration_counts,
    updates_per_iteration,
)

__all__ = ["SyncTrainer", "iteration_counts", "updates_per_iteration"]


def shutdown(*collectors: Any) -> None:
    for c in collectors:
        if c is not None:
            c.shutdown()


class SyncTrainer:
    """Alternate collection and optimisation with rlpyt's iteration, logging and evaluation semantics.

    Args:
        collector: yields ``[B, T]`` TensorDicts; ``frames_per_batch`` (or ``batch_B``·``batch_T``) gives the
            frames per iteration unless ``frames_per_itr`` is passed.
        n_steps: total env frames to train for (rounded up to a whole log interval of iterations).
        log_interval_steps: env frames between log rows (and evaluations, and checkpoints by default).
        run: a ``tdrl.log.Run`` (``log``, ``save_checkpoint``, ``load_checkpoint``, ``finish``); ``None`` keeps
            rows in :attr:`history` only.
        eval_collector: an evaluation collector (``evaluate()``), run at iteration 0 and at every log interval.
            ``None`` reports online statistics of training episodes.
        replay: off-policy replay buffer; every batch is ``replay.extend``-ed before the loop body runs.
        log_traj_window: completed training episodes kept for online statistics.
        frames_per_itr: frames per collector batch, when the collector does not say.
        replay_ratio: off-policy data reuse; with ``batch_size`` it sets :attr:`updates_per_itr`.
        batch_size: minibatch size of one gradient update (off-policy).
        min_steps_learn: env frames collected before the first update (:attr:`updates_due` is 0 until then).
        checkpoint_state: named objects with ``state_dict``/``load_state_dict`` (models, optimizers, updaters,
            schedules with state) or ``dumps``/``loads`` (replay buffers), saved in checkpoints and restored on
            resume.
        checkpoint_interval_steps: env frames between checkpoints; 0 means at every log row.
        stop_return: stop early once the evaluation (or online) mean return reaches this (benchmarks).
    """

    def __init__(
        self,
        *,
        collector: Any,
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
        checkpoint_interval_steps: int = 0,
        stop_return: float | None = None,
    ) -> None:
        if (replay_ratio is None) != (batch_size is None):
            raise ValueError("replay_ratio and batch_size go together (updates per iteration need both)")
        self.collector = collector
        self.eval_collector = eval_collector
        self.replay = replay
        self.frames_per_itr = int(frames_per_itr or frames_per_batch(collector))
        self.n_itr, self.log_interval_itrs = iteration_counts(n_steps, log_interval_steps, self.frames_per_itr)
        ckpt_itrs = int(checkpoint_interval_steps) // self.frames_per_itr
        self.checkpoint_interval_itrs = max(ckpt_itrs, 1) if checkpoint_interval_steps else self.log_interval_itrs
        self.min_itr_learn = int(min_steps_learn) // self.frames_per_itr
        self.updates_per_itr = updates_per_iteration(replay_ratio, self.frames_per_itr, batch_size) \
            if replay_ratio else 1
        self.objects = CheckpointObjects(checkpoint_state)
        self.stop_return = stop_return
        self.book = Bookkeeper(run=run, frames_per_itr=self.frames_per_itr, log_traj_window=log_traj_window,
                               update_batch_size=batch_size)
        self.resumed = False
        self.stopped_early = False

    # --- What the recipe reads -------------------------------------------------------------------------------

    @property
    def itr(self) -> int:
        """The 0-based iteration inside the loop body; completed iterations outside it."""
        return self.book.itr

    @property
    def frames(self) -> int:
        return self.book.frames

    @property
    def updates(self) -> int:
        return self.book.updates

    @property
    def history(self) -> list[dict[str, float]]:
        return self.book.history

    @property
    def updates_due(self) -> int:
        """Gradient updates this iteration owes: 0 before ``min_steps_learn``, then ``updates_per_itr``."""
        return 0 if self.book.itr < self.min_itr_learn else self.updates_per_itr

    @property
    def summary(self) -> dict[str, Any]:
        """``summary.json`` content: frames, wall and train seconds, last evaluation, counters, learning curve."""
        return self.book.summary(stopped_early=self.stopped_early)

    def record(self, metrics: Any = None, *, updates: int = 0) -> None:
        """Store this iteration's optimiser metrics (summarised at the next log row) and count gradient updates.

        Args:
            metrics: a TensorDict or mapping of scalars, or a sequence of them (e.g. one per update); keys are
                renamed by :func:`tdrl.utils.stats.metric_name` (``loss_x`` → ``loss/x``).
            updates: gradient updates done this iteration (``CumUpdates``, replay ratio, updates/s).
        """
        self.book.record(metrics, updates=updates)

    # --- The loop --------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[TensorDictBase]:
        book = self.book
        completed = False
        book.start_session()
        try:
            self._maybe_resume()
            if self.eval_collector is not None and book.itr == 0 and not self.resumed:
                book.evaluate(self.eval_collector)
                book.log()  # rlpyt's MinibatchRlEval logs the untrained agent at iteration 0
            batches = iter(self.collector)
            while book.itr < self.n_itr and not self.stopped_early:
                # weights reach the collector's workers before every batch, also the first one after a resume
                self.collector.update_policy_weights_()
                batch = next(batches)
                book.frames += batch.numel()
                book.add_episodes(self.collector.traj_infos)
                if self.replay is not None:
                    self.replay.extend(batch)
                yield batch
                book.itr += 1
                if book.itr % self.log_interval_itrs == 0:
                    if self.eval_collector is not None:
                        book.evaluate(self.eval_collector)
                    book.log()
                    self.stopped_early = book.reached(self.stop_return)
                if book.itr % self.checkpoint_interval_itrs == 0 or book.itr >= self.n_itr or self.stopped_early:
                    book.save_checkpoint(self.objects, collector=self.collector.state_dict())
            completed = True
        finally:
            book.end_session()
            shutdown(self.collector, self.eval_collector)
            book.close_run(self.summary if completed else None)

    def _maybe_resume(self) -> None:
        if self.resumed:
            return
        state = self.book.load_checkpoint(self.objects)
        if state is not None:
            self.collector.load_state_dict(state["collector"])
            self.resumed = True
