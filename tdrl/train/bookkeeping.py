"""The trainer core, so both trainers' ``progress.csv`` rows, ``history``, checkpoints and ``summary.json`` read the
same way: counters ``itr`` (collector iterations), ``frames`` (env frames, all ranks), ``updates`` and
``episodes``; the last ``log_traj_window`` training episodes; the optimiser metrics since the last row (``loss_x``
-> ``loss/x_{mean,std,median,min,max}``); wall time split into training (``time/train_s``, rlpyt's CumTrainTime)
and evaluation (``time/eval_s``); and the one SIGTERM policy (:attr:`Bookkeeper.sigterm`): while a session runs, SIGTERM
waits for the trainer's next iteration boundary, which checkpoints and stops.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

from tdrl.train.protocols import Evaluator, RunLog
from tdrl.train.schedule import Cadence, Schedule
from tdrl.utils.distributed import world_size
from tdrl.utils.interrupt import SigtermAtBoundary
from tdrl.utils.stats import metrics_to_floats, summarize_metrics, summarize_records

__all__ = ["Bookkeeper", "CheckpointObjects", "book_counter", "eval_collector_state", "frames_per_batch",
           "load_eval_collector_state"]


def frames_per_batch(collector: Any) -> int:
    """Frames of one collector batch: its ``frames_per_batch``, else ``batch_B * batch_T`` from the keywords of a
    ``functools.partial`` that builds one."""
    value = getattr(collector, "frames_per_batch", None)
    if value:
        return int(value)
    keywords = getattr(collector, "keywords", None) or {}
    if keywords.get("batch_B") and keywords.get("batch_T"):
        return int(keywords["batch_B"]) * int(keywords["batch_T"])
    raise ValueError(f"cannot tell the frames per batch of {type(collector).__name__} (no frames_per_batch, "
                     "batch_B x batch_T); pass frames_per_itr=")


def book_counter(name: str, doc: str) -> property:
    """A read-only trainer attribute that reads its :class:`Bookkeeper`'s (``trainer.itr`` is ``trainer.book.itr``)."""
    return property(lambda trainer: getattr(trainer.book, name), doc=doc)


def eval_collector_state(eval_collector: Evaluator | None) -> dict[str, Any]:
    """``{"eval_collector": its state_dict()}`` for a checkpoint (``{}`` without an evaluator), so a resumed run's
    evaluations continue the evaluation envs' streams (the same initial states as an uninterrupted run)."""
    return {} if eval_collector is None else {"eval_collector": eval_collector.state_dict()}


def load_eval_collector_state(eval_collector: Evaluator | None, state: Mapping[str, Any]) -> None:
    """Restore :func:`eval_collector_state` (a checkpoint without it leaves the evaluator freshly seeded)."""
    if eval_collector is not None and "eval_collector" in state:
        eval_collector.load_state_dict(state["eval_collector"])


class CheckpointObjects:
    """The named objects a trainer checkpoints: models, optimizers, updaters (``state_dict``/``load_state_dict``)
    and objects that write their own files (replay buffers: ``dumps(dir)``/``loads(dir)``, through the Run's
    extra writers; with ``files=False`` their ``state_dict`` is saved instead)."""

    def __init__(self, objects: Mapping[str, Any] | None, *, files: bool = True) -> None:
        self.states: dict[str, Any] = {}
        self.files: dict[str, Any] = {}
        for name, obj in (objects or {}).items():
            if files and hasattr(obj, "dumps") and hasattr(obj, "loads"):
                self.files[name] = obj
            elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
                self.states[name] = obj
            else:
                raise TypeError(f"checkpoint_state['{name}'] ({type(obj).__name__}) has neither "
                                "state_dict/load_state_dict nor dumps/loads")

    def state_dict(self) -> dict[str, Any]:
        return {name: obj.state_dict() for name, obj in self.states.items()}

    def check_finite(self) -> None:
        """Call ``check_finite()`` of the objects that have one (updaters: a skipped NaN/inf update raises
        :class:`~tdrl.objectives.update.NonFiniteLossError` here, at the next log row or checkpoint)."""
        for obj in [*self.states.values(), *self.files.values()]:
            if callable(check := getattr(obj, "check_finite", None)):
                check()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, obj in self.states.items():
            if name not in state:
                raise KeyError(f"checkpoint has no '{name}' (it has {sorted(state)})")
            obj.load_state_dict(state[name])

    def writers(self) -> dict[str, Any] | None:
        """``extra_writers``: an object's ``checkpoint_writer()`` where it has one (a ``tdrl.ckpt.LinkingWriter``
        that shares unchanged files with the previous checkpoint), else its ``dumps``."""
        return {name: obj.checkpoint_writer() if hasattr(obj, "checkpoint_writer") else obj.dumps
                for name, obj in self.files.items()} or None

    def readers(self) -> dict[str, Any] | None:
        return {name: obj.loads for name, obj in self.files.items()} or None


class Bookkeeper:
    """The books of one training run, written to ``run`` (a ``tdrl.log.Run``, or ``None``: rows only in
    :attr:`history`), and its :class:`~tdrl.train.schedule.Schedule`, in iterations of ``frames_per_itr`` frames
    (all ranks) as :attr:`cadence`. A checkpoint taken with another ``frames_per_itr`` is refused;
    ``update_batch_size`` (samples per update, all ranks; ``None`` on-policy) feeds the replay-ratio columns.
    :attr:`sigterm` defers SIGTERM from :meth:`start_session` to :meth:`end_session`: the trainer checkpoints at its
    next boundary when ``sigterm.requested``, then calls ``sigterm.stop_here()`` (not on data-parallel ranks, which
    would have to agree on the boundary: SIGTERM stops them at once).
    """

    def __init__(self, *, schedule: Schedule, frames_per_itr: int, run: RunLog | None = None,
                 log_traj_window: int = 100, update_batch_size: int | None = None) -> None:
        self.run = run
        self.schedule = schedule
        self.cadence: Cadence = schedule.cadence(frames_per_itr)
        self.frames_per_itr = frames_per_itr
        self.log_traj_window = log_traj_window
        self.update_batch_size = update_batch_size
        self.itr = self.frames = self.updates = self.episodes = 0
        self.traj_window: deque[dict[str, float]] = deque(maxlen=log_traj_window)
        self.new_trajs: list[dict[str, float]] = []
        self.metrics: list[Any] = []
        self.last_eval: dict[str, float] = {}
        self.history: list[dict[str, float]] = []
        self.curve: list[dict[str, float]] = []
        self.eval_s = 0.0
        self.phase_s: dict[str, float] = {}  # training wall time by phase of the loop (time/<phase>_s columns)
        self._train_s = 0.0  # training wall time of earlier sessions (resumes)
        self._session_start: float | None = None
        self._session_excluded_s = 0.0
        self._frames_at_log = 0
        self._updates_at_log = 0
        self._train_s_at_log = 0.0
        self.sigterm = SigtermAtBoundary(enabled=world_size() == 1)

    def start_session(self) -> None:
        self._session_start = time.perf_counter()
        self._session_excluded_s = 0.0
        self.sigterm.arm()

    def end_session(self) -> None:
        self.sigterm.disarm()
        self._train_s = self.train_s
        self._session_start = None

    @property
    def train_s(self) -> float:
        """Wall-clock seconds of training so far, over every session, evaluation and pauses excluded."""
        if self._session_start is None:
            return self._train_s
        return self._train_s + time.perf_counter() - self._session_start - self._session_excluded_s

    @contextlib.contextmanager
    def paused(self, *, evaluating: bool = False) -> Iterator[None]:
        """Leave the enclosed time out of training time (starting worker processes; evaluations, which count into
        ``eval_s``)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self._session_excluded_s += elapsed
            if evaluating:
                self.eval_s += elapsed

    def add_phase(self, phase: str, seconds: float) -> None:
        """Count ``seconds`` of training time into ``phase`` (collect, extend, learn, log, checkpoint): the
        ``time/<phase>_s`` columns, cumulative as ``time/train_s``, say where an iteration's time goes. On a GPU a
        phase that reads results back to the host also waits there for the GPU work queued before it."""
        self.phase_s[phase] = self.phase_s.get(phase, 0.0) + seconds

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Count the enclosed wall time into ``phase`` (:meth:`add_phase`)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_phase(phase, time.perf_counter() - start)

    def add_episodes(self, trajs: Sequence[dict[str, float]]) -> None:
        self.episodes += len(trajs)
        self.traj_window.extend(trajs)
        self.new_trajs.extend(trajs)

    def record(self, metrics: Any = None, *, updates: int = 0) -> None:
        """Store optimiser metrics (a TensorDict/mapping or a list of them) and count gradient updates."""
        self.updates += int(updates)
        if isinstance(metrics, (TensorDictBase, Mapping)):
            self.metrics.append(metrics)
        elif isinstance(metrics, Sequence):
            self.metrics.extend(metrics)
        elif metrics is not None:
            raise TypeError(f"record() takes a TensorDict, a mapping or a list of them, got {type(metrics).__name__}")

    def evaluate(self, eval_collector: Evaluator) -> None:
        """Run one evaluation (``eval_collector.evaluate()``: whole greedy episodes), timed as evaluation."""
        with self.paused(evaluating=True):  # excluded from time/train_s and frames/s
            trajs = eval_collector.evaluate()
            frames = getattr(eval_collector, "video_frames", None)  # eval.video=true: env 0's episode
            if frames is not None and self.run is not None:
                self.run.log_video(frames, step=self.frames)
        self.last_eval = {**summarize_records(trajs, "eval/"), "eval/episodes": float(len(trajs))}

    def reached(self) -> bool:
        """Whether the last evaluation's mean return (else the online window's) reached the schedule's
        ``stop_return``."""
        stop_return = self.schedule.stop_return
        if stop_return is None:
            return False
        online = summarize_records(self.traj_window, "").get("return_mean")
        ret = self.last_eval.get("eval/return_mean", online)
        return ret is not None and ret >= stop_return

    def log(self, extra: Mapping[str, float] | None = None, *, metrics: Sequence[Any] | None = None
            ) -> dict[str, float]:
        """Write one row and reset the per-interval accumulators; ``metrics`` (gathered from all ranks) replace the
        locally recorded ones, which are cleared either way. The one place the run's counters and rates are
        computed: rlpyt's columns (:data:`tdrl.log.RESERVED_COLUMNS`), rates over training time (evaluation
        excluded, as rlpyt's), then ``time/``, ``train/``, the metrics, the last evaluation and ``extra``."""
        train_s = self.train_s
        d_frames = self.frames - self._frames_at_log
        d_updates = self.updates - self._updates_at_log
        d_time = max(train_s - self._train_s_at_log, 1e-9)
        n_new = len(self.new_trajs)
        row: dict[str, float] = {
            "Iteration": self.itr, "CumSteps": self.frames, "CumTime": train_s + self.eval_s,
            "StepsPerSecond": d_frames / d_time, "NewCompletedTrajs": n_new, "CumCompletedTrajs": self.episodes,
            "CumUpdates": self.updates, "UpdatesPerSecond": d_updates / d_time,
        }
        if self.update_batch_size:  # samples trained on per new env frame: this interval, and so far
            row["ReplayRatio"] = d_updates * self.update_batch_size / d_frames if d_frames else math.nan
            row["CumReplayRatio"] = self.updates * self.update_batch_size / self.frames if self.frames else math.nan
        row.update({"time/train_s": train_s, "time/eval_s": self.eval_s})
        row.update({f"time/{phase}_s": seconds for phase, seconds in self.phase_s.items()})
        row.update(summarize_records(self.traj_window, "train/"))
        row.update(summarize_metrics(self.metrics if metrics is None else metrics))
        row.update(self.last_eval)
        row.update(extra or {})
        self.metrics.clear()
        self.new_trajs.clear()
        self._frames_at_log, self._updates_at_log, self._train_s_at_log = self.frames, self.updates, train_s
        self.history.append(row)
        ret = row.get("eval/return_mean", row.get("train/return_mean"))
        if ret is not None and math.isfinite(ret):
            self.curve.append({"frames": self.frames, "train_s": round(train_s, 3), "return_mean": ret})
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if k not in ("Iteration", "CumSteps")}, step=self.frames,
                         iteration=self.itr)
        return row

    def summary(self, *, stopped_early: bool = False, **extra: Any) -> dict[str, Any]:
        """``summary.json`` content, as SyncTrainer's: frames, wall/train seconds, last evaluation, curve."""
        train_s = self.train_s
        out: dict[str, Any] = {
            "frames": self.frames, "wall_s": round(train_s + self.eval_s, 3), "train_s": round(train_s, 3),
            "iterations": self.itr, "updates": self.updates, "episodes": self.episodes,
            "eval/return_mean": self.last_eval.get("eval/return_mean", float("nan")),
        }
        online = summarize_records(self.traj_window, "train/")
        if "train/return_mean" in online:
            out["train/return_mean"] = online["train/return_mean"]
        return {**out, **extra, "stopped_early": stopped_early, "curve": list(self.curve)}

    def close_run(self, summary: Mapping[str, Any] | None) -> None:
        """Finish the run with ``summary`` (the loop completed), else close it without ``summary.json``; once."""
        run, self.run = self.run, None
        if run is None:
            return
        if summary is not None:
            run.finish(summary)
        else:
            run.close(exit_code=1)

    def will_checkpoint(self) -> bool:
        """Whether a checkpoint after ``itr`` would be written (a run, and a snapshot mode that keeps it)."""
        return self.run is not None and self.run.will_checkpoint(self.itr)

    def save_checkpoint(self, objects: CheckpointObjects, **state: Any) -> None:
        """Checkpoint ``objects``, these books and ``state`` (collector...) through the run, after ``itr``."""
        if self.run is None:
            return
        full = {**objects.state_dict(), **state, "trainer": self.state_dict()}
        # the Run adds the RNG states and its logger position
        self.run.save_checkpoint(full, self.itr, step=self.frames, extra_writers=objects.writers())

    def load_checkpoint(self, objects: CheckpointObjects, share: Callable[[Any], Any] | None = None
                        ) -> dict[str, Any] | None:
        """Restore ``objects`` and these books from the run's newest checkpoint (the Run restores the RNG states);
        its state, or ``None``. ``share`` hands the state rank 0 read to every rank."""
        state = self.run.load_checkpoint(extra_readers=objects.readers()) if self.run is not None else None
        if share is not None:
            state = share(state)
        if not state:
            return None
        self.load_state_dict(state["trainer"])
        objects.load_state_dict(state)
        return state

    def state_dict(self) -> dict[str, Any]:
        return {
            "itr": self.itr, "frames": self.frames, "updates": self.updates, "episodes": self.episodes,
            "train_s": self.train_s, "eval_s": self.eval_s, "phase_s": dict(self.phase_s),
            "traj_window": list(self.traj_window),
            "frames_at_log": self._frames_at_log, "updates_at_log": self._updates_at_log,
            "train_s_at_log": self._train_s_at_log, "last_eval": dict(self.last_eval), "curve": list(self.curve),
            "frames_per_itr": self.frames_per_itr,
            # a checkpoint between log rows: the next row still summarises the whole interval
            "metrics": metrics_to_floats(self.metrics), "new_trajs": list(self.new_trajs),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["frames_per_itr"] != self.frames_per_itr:
            raise ValueError(f"checkpoint was taken with {state['frames_per_itr']} frames per iteration, this run has "
                             f"{self.frames_per_itr}: the collector's B×T (or the world size) changed")
        self.itr, self.frames = int(state["itr"]), int(state["frames"])
        self.updates, self.episodes = int(state["updates"]), int(state["episodes"])
        self._train_s, self.eval_s = float(state["train_s"]), float(state["eval_s"])
        self.phase_s = {phase: float(seconds) for phase, seconds in state.get("phase_s", {}).items()}
        self.traj_window = deque(state["traj_window"], maxlen=self.log_traj_window)
        self._frames_at_log, self._updates_at_log = int(state["frames_at_log"]), int(state["updates_at_log"])
        self._train_s_at_log = float(state["train_s_at_log"])
        self.last_eval = dict(state["last_eval"])
        self.curve = list(state["curve"])
        self.metrics, self.new_trajs = list(state.get("metrics", [])), list(state.get("new_trajs", []))
        self.start_session()
