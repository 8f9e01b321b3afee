"""The trainer core: what the sync, async and Ray trainers share, so they cannot drift. A trainer is this loop
around its own way of getting data::

    session:  resume from the newest checkpoint | evaluate and log the untrained agent (iteration 0)
              loop: data arrives (the trainer's own) -> the recipe's body -> boundary()
              finish the run with summary.json (the loop completed) or close it without (anything else)
    boundary: after the iterations that complete a log interval (or the run): evaluate, write the row, stop early
              once stop_return is reached; after those that complete a checkpoint interval (or the run, an early
              stop, a SIGTERM): checkpoint; then stop here on SIGTERM.

Each trainer supplies the hooks: :meth:`_close` (stop what it started), :meth:`_checkpoint_extra` and
:meth:`_restore` (its own state in checkpoints), :meth:`_row_extra` (its own columns), :meth:`_summary_extra`; the
data-parallel trainer also overrides :meth:`_agree` (rank 0 decides), :meth:`_share` and :meth:`_write_row`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from tdrl.train.bookkeeping import (
    Bookkeeper,
    CheckpointObjects,
    book_counter,
    eval_collector_state,
    load_eval_collector_state,
)
from tdrl.train.protocols import Evaluator, Replay, RunLog
from tdrl.train.schedule import Cadence, Schedule

__all__ = ["TrainerCore", "owned_state"]

T = TypeVar("T")


def owned_state(checkpoint_state: Mapping[str, Any] | None, replay: Replay | None) -> dict[str, Any]:
    """``checkpoint_state`` with the replay the trainer fills, under ``"replay"`` unless it is there already: the
    trainer owns what it needs to resume, whoever wrote the loop."""
    state = dict(checkpoint_state or {})
    if replay is None or any(obj is replay for obj in state.values()):
        return state
    if "replay" in state:
        raise ValueError("checkpoint_state['replay'] is another object than the trainer's replay; name it "
                         "differently (the trainer checkpoints its replay as 'replay')")
    return {**state, "replay": replay}


class TrainerCore:
    """Schedule, books, evaluation, log rows, checkpoints, resume and summary of a trainer (module docstring).

    Args:
        schedule: when the run logs, checkpoints, starts learning and stops (:class:`~tdrl.train.Schedule`).
        frames_per_itr: env frames of one iteration, all ranks.
        run: a ``tdrl.log.Run`` (rank 0 only); ``None`` keeps rows in :attr:`history` only.
        eval_collector: ``evaluate()`` returns whole greedy episodes, ``state_dict()``/``load_state_dict()`` carry
            its envs through checkpoints; ``None`` reports online training episodes.
        checkpoint_state: named objects with ``state_dict``/``load_state_dict`` (models, optimizers, updaters) or
            ``dumps``/``loads`` (replay buffers), saved in checkpoints and restored on resume; the trainer adds its
            ``replay`` as ``"replay"``. Those with ``check_finite()`` (updaters) are checked before every log row
            and checkpoint: an update skipped for a NaN/inf loss raises ``NonFiniteLossError`` there.
        replay: the replay the trainer fills (or its collectors do), checkpointed with the rest.
        log_traj_window: completed training episodes kept for online statistics.
        update_batch_size: samples per update, all ranks (the replay-ratio columns); ``None`` on-policy.
    """

    def __init__(self, *, schedule: Schedule, frames_per_itr: int, run: RunLog | None,
                 eval_collector: Evaluator | None, checkpoint_state: Mapping[str, Any] | None,
                 replay: Replay | None, log_traj_window: int, update_batch_size: int | None) -> None:
        self.schedule = schedule
        self.eval_collector = eval_collector
        self.replay = replay
        self.objects = CheckpointObjects(owned_state(checkpoint_state, replay))
        self.book = Bookkeeper(run=run, schedule=schedule, frames_per_itr=frames_per_itr,
                               log_traj_window=log_traj_window, update_batch_size=update_batch_size)
        self.resumed = False
        self.stopped_early = False
        self._logged = self._saved = 0  # log and checkpoint intervals completed

    itr = book_counter("itr", "Collector iterations: the 0-based iteration inside the loop body, done ones outside.")
    frames = book_counter("frames", "Env frames collected (all ranks).")
    updates = book_counter("updates", "Gradient updates recorded.")
    history = book_counter("history", "Log rows (complete on rank 0; other data-parallel ranks hold counters only).")

    @property
    def cadence(self) -> Cadence:
        """The schedule in this trainer's iterations."""
        return self.book.cadence

    @property
    def n_itr(self) -> int:
        """Iterations the run has in all (e.g. the length of a learning-rate decay)."""
        return self.book.cadence.n_itr

    @property
    def frames_per_itr(self) -> int:
        return self.book.frames_per_itr

    @property
    def summary(self) -> dict[str, Any]:
        """``summary.json`` content: frames, wall and train seconds, last evaluation, counters, learning curve."""
        return self.book.summary(stopped_early=self.stopped_early, **self._summary_extra())

    def record(self, metrics: Any = None, *, updates: int = 0) -> None:
        """Store this iteration's optimiser metrics (a TensorDict/mapping or a list of them, summarised at the next
        log row as ``loss_x`` -> ``loss/x_mean``...) and count its gradient updates."""
        self.book.record(metrics, updates=updates)

    # --- The session and the boundary ---------------------------------------------------------------------------

    def _session(self, loop: Callable[[], Iterator[T]]) -> Iterator[T]:
        """Run ``loop`` (which yields to the recipe's body and calls :meth:`_boundary`) as one session of the run."""
        book, completed = self.book, False
        book.start_session()
        try:
            self._resume()
            if book.itr == 0 and not self.resumed and self._agree(self.eval_collector is not None):
                self._evaluate()
                self._write_row()  # rlpyt's MinibatchRlEval logs the untrained agent at iteration 0
            yield from loop()
            completed = True
        finally:
            book.end_session()
            self._close()
            book.close_run(self.summary if completed else None)

    def _body(self, value: T) -> Iterator[T]:
        """Yield ``value`` to the recipe's loop body, whose wall time counts as ``time/learn_s``."""
        start = time.perf_counter()
        yield value
        self.book.add_phase("learn", time.perf_counter() - start)

    def _boundary(self) -> bool:
        """Log, evaluate and checkpoint as the schedule says after the iterations done so far (``itr`` may have
        passed several at once: a Ray rollout); returns whether the run is over."""
        book, cadence = self.book, self.book.cadence
        final = book.itr >= cadence.n_itr
        if book.itr // cadence.log_interval_itrs > self._logged or final:
            self._logged = book.itr // cadence.log_interval_itrs
            self._evaluate()
            self._write_row()
            self.stopped_early = bool(self._agree(book.reached()))
        over = final or self.stopped_early
        if book.itr // cadence.checkpoint_interval_itrs > self._saved or over or book.sigterm.requested:
            self._saved = book.itr // cadence.checkpoint_interval_itrs
            self._save_checkpoint()
        book.sigterm.stop_here(final=over)
        return over

    def _evaluate(self) -> None:
        if self.eval_collector is not None:
            self.book.evaluate(self.eval_collector)

    def _write_row(self) -> None:
        with self.book.timed("log"):
            self.objects.check_finite()  # updates skipped for a NaN/inf loss since the last row raise here
            self.book.log(self._row_extra())

    def _save_checkpoint(self) -> None:
        if not self._agree(self.book.will_checkpoint()):  # checkpoint.snapshot_mode=none: gather nothing
            return
        with self.book.timed("checkpoint"):
            self.objects.check_finite()
            self.book.save_checkpoint(self.objects, **self._checkpoint_extra(),
                                      **eval_collector_state(self.eval_collector))

    def _resume(self) -> None:
        if self.resumed:
            return
        state = self.book.load_checkpoint(self.objects, share=self._share)
        if not state:
            return
        self._restore(state)
        load_eval_collector_state(self.eval_collector, state)
        cadence = self.book.cadence
        self._logged = self.book.itr // cadence.log_interval_itrs
        self._saved = self.book.itr // cadence.checkpoint_interval_itrs
        self.resumed = True

    # --- Hooks ----------------------------------------------------------------------------------------------------

    def _agree(self, value: bool) -> bool:
        """A decision every process of the trainer takes together (data parallel: rank 0's)."""
        return value

    _share: Callable[[Any], Any] | None = None
    """Hands the checkpoint state rank 0 read to every rank (data parallel)."""

    def _close(self) -> None:
        """Stop the trainer's collectors, processes or actors (once the session ends, however it ends)."""

    def _checkpoint_extra(self) -> dict[str, Any]:
        """The trainer's own state in a checkpoint (its collector's, RNGs...)."""
        return {}

    def _restore(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`_checkpoint_extra` from a checkpoint's ``state``."""

    def _row_extra(self) -> dict[str, float]:
        """The trainer's own columns in a log row."""
        return {}

    def _summary_extra(self) -> dict[str, Any]:
        return {}
