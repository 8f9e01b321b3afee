"""Counters, episode window, optimiser metrics, timers and log rows shared by the multi-process trainers.

:class:`~tdrl.train.ddp.DataParallelTrainer` and :class:`~tdrl.train.async_.AsyncTrainer` keep the same books as
:class:`~tdrl.train.SyncTrainer`, so their ``progress.csv`` rows, ``history`` entries, checkpoints and
``summary.json`` read the same way:

* counters ``itr`` (collector iterations), ``frames`` (env frames, all ranks), ``updates`` (gradient updates),
  ``episodes`` (completed training episodes);
* the online window of the last ``log_traj_window`` training episodes and the episodes new since the last row;
* the optimiser metrics recorded since the last row (``loss_x`` → ``loss/x_{mean,std,median,min,max}``);
* wall time split into training (``time/train_s``, rlpyt's CumTrainTime) and evaluation (``time/eval_s``).

A row is written to the :class:`tdrl.log.Run` (when there is one) and appended to :attr:`Bookkeeper.history`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from tdrl.train.stats import episode_stats, scalar_stats

__all__ = ["Bookkeeper", "metrics_to_floats"]


def metrics_to_floats(metrics: Sequence[Any]) -> list[dict[str, float]]:
    """Recorded metric entries (TensorDicts or mappings) as plain ``{name: float}`` dicts (picklable, cheap to
    send between processes). Nested keys become ``a/b``; non-scalar entries are dropped."""
    out = []
    for m in metrics:
        items = m.items(include_nested=True, leaves_only=True) if isinstance(m, TensorDictBase) else m.items()
        row: dict[str, float] = {}
        for key, value in items:
            name = "/".join(key) if isinstance(key, tuple) else str(key)
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    continue
                row[name] = float(value.detach().reshape(()).item())
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                row[name] = float(value)
        out.append(row)
    return out


class Bookkeeper:
    """The books of one training run (see the module docstring).

    Args:
        run: a ``tdrl.log.Run`` or ``None`` (rows only in :attr:`history`).
        log_traj_window: completed training episodes kept for online statistics.
        update_batch_size: samples per gradient update (all ranks), for the replay-ratio columns; ``None`` for
            on-policy training.
    """

    def __init__(self, *, run: Any = None, log_traj_window: int = 100, update_batch_size: int | None = None) -> None:
        self.run = run
        self.log_traj_window = log_traj_window
        self.update_batch_size = update_batch_size
        self.itr = 0
        self.frames = 0
        self.updates = 0
        self.episodes = 0
        self.traj_window: deque[dict[str, float]] = deque(maxlen=log_traj_window)
        self.new_trajs: list[dict[str, float]] = []
        self.metrics: list[Any] = []
        self.last_eval: dict[str, float] = {}
        self.history: list[dict[str, float]] = []
        self.curve: list[dict[str, float]] = []
        self._train_s = 0.0  # training wall time of earlier sessions (resumes)
        self._eval_s = 0.0
        self._session_start = 0.0
        self._session_eval_s = 0.0
        self._session_paused_s = 0.0
        self._frames_at_log = 0
        self._updates_at_log = 0
        self._train_s_at_log = 0.0

    # --- time -------------------------------------------------------------------------------------------------

    def start_session(self) -> None:
        self._session_start = time.perf_counter()
        self._session_eval_s = 0.0
        self._session_paused_s = 0.0

    def end_session(self) -> None:
        self._train_s = self.train_s
        self._eval_s += self._session_eval_s
        self._session_eval_s = 0.0
        self._session_paused_s = 0.0
        self._session_start = 0.0

    @property
    def train_s(self) -> float:
        """Wall-clock seconds of training so far, evaluation excluded, over every session."""
        live = time.perf_counter() - self._session_start if self._session_start else 0.0
        return self._train_s + live - self._session_eval_s - self._session_paused_s

    @property
    def eval_s(self) -> float:
        return self._eval_s + self._session_eval_s

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the enclosed time out of training and evaluation time (starting worker processes)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._session_paused_s += time.perf_counter() - start

    @contextlib.contextmanager
    def timing_eval(self) -> Iterator[None]:
        """Count the enclosed time as evaluation (excluded from ``time/train_s`` and frames/s)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._session_eval_s += time.perf_counter() - start

    # --- what happened --------------------------------------------------------------------------------------

    def add_episodes(self, trajs: Sequence[dict[str, float]]) -> None:
        self.episodes += len(trajs)
        self.traj_window.extend(trajs)
        self.new_trajs.extend(trajs)

    def record(self, metrics: Any = None, *, updates: int = 0) -> None:
        """Store optimiser metrics (a TensorDict/mapping or a list of them) and count gradient updates."""
        self.updates += int(updates)
        if metrics is None:
            return
        if isinstance(metrics, (TensorDictBase, Mapping)):
            self.metrics.append(metrics)
        elif isinstance(metrics, Sequence):
            self.metrics.extend(metrics)
        else:
            raise TypeError(f"record() takes a TensorDict, a mapping or a list of them, got {type(metrics).__name__}")

    def online_return(self) -> float | None:
        """Mean return of the online episode window (``None`` before the first episode)."""
        return episode_stats(list(self.traj_window)).get("return_mean")

    # --- rows -------------------------------------------------------------------------------------------------

    def log(self, extra: Mapping[str, float] | None = None, *, metrics: Sequence[Any] | None = None,
            new_episodes: int | None = None) -> dict[str, float]:
        """Write one row (SyncTrainer's columns plus ``extra``) and reset the per-interval accumulators.

        Args:
            extra: more metrics for this row (``replay/...``, ``time/...``).
            metrics: optimiser metrics to summarise instead of the locally recorded ones (gathered from all
                ranks); the local ones are cleared either way.
            new_episodes: episodes completed since the last row when they were counted elsewhere (all ranks).
        """
        train_s = self.train_s
        d_frames = self.frames - self._frames_at_log
        d_updates = self.updates - self._updates_at_log
        d_time = max(train_s - self._train_s_at_log, 1e-9)
        row: dict[str, float] = {
            "time/train_s": train_s,
            "time/eval_s": self.eval_s,
            "time/train_fps": d_frames / d_time if self.itr else 0.0,
        }
        row.update(episode_stats(list(self.traj_window), prefix="train/"))
        row.update(scalar_stats(self.metrics if metrics is None else metrics))
        row.update(self.last_eval)
        row.update(extra or {})
        n_new = len(self.new_trajs) if new_episodes is None else int(new_episodes)
        self.metrics.clear()
        self.new_trajs.clear()
        counters: dict[str, float] = {"iteration": self.itr, "frames": self.frames, "updates": self.updates,
                                      "episodes": self.episodes, "new_episodes": n_new}
        if self.update_batch_size and self.frames:
            counters["replay_ratio"] = d_updates * self.update_batch_size / max(d_frames, 1)
            counters["cum_replay_ratio"] = self.updates * self.update_batch_size / self.frames
        self._frames_at_log, self._updates_at_log, self._train_s_at_log = self.frames, self.updates, train_s
        self.history.append({**counters, **row})
        ret = row.get("eval/return_mean", row.get("train/return_mean"))
        if ret is not None and math.isfinite(ret):
            self.curve.append({"frames": self.frames, "train_s": round(train_s, 3), "return_mean": ret})
        if self.run is not None:
            self.run.log(row, step=self.frames, iteration=self.itr, updates=self.updates,
                         update_batch_size=self.update_batch_size, episodes=n_new)
        return row

    def summary(self, *, stopped_early: bool = False, **extra: Any) -> dict[str, Any]:
        """``summary.json`` content, as SyncTrainer's: frames, wall/train seconds, last evaluation, curve."""
        out: dict[str, Any] = {
            "frames": self.frames,
            "wall_s": round(self.train_s + self.eval_s, 3),
            "train_s": round(self.train_s, 3),
            "iterations": self.itr,
            "updates": self.updates,
            "episodes": self.episodes,
            "eval/return_mean": self.last_eval.get("eval/return_mean", float("nan")),
        }
        online = episode_stats(list(self.traj_window), prefix="train/")
        if "train/return_mean" in online:
            out["train/return_mean"] = online["train/return_mean"]
        out.update(extra)
        out["stopped_early"] = stopped_early
        out["curve"] = list(self.curve)
        return out

    # --- checkpoint ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "itr": self.itr, "frames": self.frames, "updates": self.updates, "episodes": self.episodes,
            "train_s": self.train_s, "eval_s": self.eval_s, "traj_window": list(self.traj_window),
            "frames_at_log": self._frames_at_log, "updates_at_log": self._updates_at_log,
            "train_s_at_log": self._train_s_at_log, "last_eval": dict(self.last_eval), "curve": list(self.curve),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.itr, self.frames = int(state["itr"]), int(state["frames"])
        self.updates, self.episodes = int(state["updates"]), int(state["episodes"])
        self._train_s, self._eval_s = float(state["train_s"]), float(state["eval_s"])
        self.traj_window = deque(state["traj_window"], maxlen=self.log_traj_window)
        self._frames_at_log, self._updates_at_log = int(state["frames_at_log"]), int(state["updates_at_log"])
        self._train_s_at_log = float(state["train_s_at_log"])
        self.last_eval = dict(state["last_eval"])
        self.curve = list(state["curve"])
        self._session_start = time.perf_counter()
        self._session_eval_s = 0.0
        self._session_paused_s = 0.0
