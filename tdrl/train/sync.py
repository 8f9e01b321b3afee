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

    trainer = SyncTrainer(..., replay_ratio=8, batch_size=256, min_steps_learn=1_000)
    for batch in trainer:
        replay.extend(batch.reshape(-1))
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
which is what the unit tests use. Collectors are duck-typed on TorchRL's collector protocol (iteration,
``update_policy_weights_()``, ``shutdown()``, ``state_dict()``); the eval collector is anything with
``evaluate()`` or a tdrl collector (one ``collect()``, its ``traj_infos``). The trainer shuts both down when the
loop ends, however it ends; an interrupted run is closed without ``summary.json``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

from tdrl.train.stats import episode_stats, eval_episodes, new_episodes, scalar_stats

__all__ = ["SyncTrainer", "iteration_counts", "updates_per_iteration"]


def iteration_counts(n_steps: int, log_interval_steps: int, frames_per_itr: int) -> tuple[int, int]:
    """rlpyt's ``get_n_itr``: ``(n_itr, log_interval_itrs)`` with ``n_itr`` rounded up to a log boundary."""
    if frames_per_itr <= 0:
        raise ValueError(f"frames_per_itr must be positive, got {frames_per_itr}")
    log_interval_itrs = max(int(log_interval_steps) // frames_per_itr, 1)
    n_itr = max(int(n_steps) // frames_per_itr, 1)
    if n_itr % log_interval_itrs:
        n_itr += log_interval_itrs - n_itr % log_interval_itrs
    return n_itr, log_interval_itrs


def updates_per_iteration(replay_ratio: float, frames_per_itr: int, batch_size: int) -> int:
    """rlpyt's off-policy update count: ``max(1, round(replay_ratio * frames_per_itr / batch_size))``.

    ``replay_ratio`` is data consumed by the optimiser over data generated by the collector (e.g. 8 means every
    transition is sampled about 8 times).
    """
    if replay_ratio <= 0 or batch_size <= 0:
        raise ValueError(f"replay_ratio and batch_size must be positive, got {replay_ratio}, {batch_size}")
    return max(1, round(replay_ratio * frames_per_itr / batch_size))


class SyncTrainer:
    """Alternate collection and optimisation with rlpyt's iteration, logging and evaluation semantics.

    Args:
        collector: yields ``[B, T]`` TensorDicts; ``frames_per_batch`` (or ``batch_B``·``batch_T``) gives the
            frames per iteration unless ``frames_per_itr`` is passed.
        n_steps: total env frames to train for (rounded up to a whole log interval of iterations).
        log_interval_steps: env frames between log rows (and evaluations, and checkpoints by default).
        run: a ``tdrl.log.Run`` (``log``, ``save_checkpoint``, ``load_checkpoint``, ``finish``); ``None`` keeps
            rows in :attr:`history` only.
        eval_collector: an evaluation collector (greedy policy, own envs); evaluated at iteration 0 and at
            every log interval. ``None`` reports online statistics of training episodes.
        log_traj_window: completed training episodes kept for online statistics.
        frames_per_itr: frames per collector batch, when the collector does not say.
        replay_ratio: off-policy data reuse; with ``batch_size`` it sets :attr:`updates_per_itr`.
        batch_size: minibatch size of one gradient update (off-policy).
        min_steps_learn: env frames collected before the first update (:attr:`updates_due` is 0 until then).
        checkpoint_state: named objects with ``state_dict``/``load_state_dict`` (models, optimizers, updaters,
            replay buffers, schedules with state) saved in checkpoints and restored on resume.
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
        log_traj_window: int = 100,
        frames_per_itr: int | None = None,
        replay_ratio: float | None = None,
        batch_size: int | None = None,
        min_steps_learn: int = 0,
        checkpoint_state: Mapping[str, Any] | None = None,
        checkpoint_interval_steps: int = 0,
        stop_return: float | None = None,
    ) -> None:
        if n_steps <= 0 or log_interval_steps <= 0:
            raise ValueError(f"n_steps and log_interval_steps must be positive, got {n_steps}, {log_interval_steps}")
        self.collector = collector
        self.eval_collector = eval_collector
        self.run = run
        self.frames_per_itr = int(frames_per_itr or _frames_per_batch(collector))
        self.n_itr, self.log_interval_itrs = iteration_counts(n_steps, log_interval_steps, self.frames_per_itr)
        self.log_traj_window = log_traj_window
        self.min_itr_learn = int(min_steps_learn) // self.frames_per_itr
        self.batch_size = batch_size
        if (replay_ratio is None) != (batch_size is None):
            raise ValueError("replay_ratio and batch_size go together (updates per iteration need both)")
        self.updates_per_itr = (
            updates_per_iteration(replay_ratio, self.frames_per_itr, batch_size) if replay_ratio else 1
        )
        self.checkpoint_state = dict(checkpoint_state or {})
        # objects that write their own files (replay buffers: ``dumps(dir)``/``loads(dir)``) are checkpointed
        # through the Run's extra writers; the rest through ``state_dict``/``load_state_dict``
        self._file_state = {n: o for n, o in self.checkpoint_state.items() if hasattr(o, "dumps") and hasattr(o, "loads")}
        for name, obj in self.checkpoint_state.items():
            if name not in self._file_state and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(
                    f"checkpoint_state['{name}'] ({type(obj).__name__}) has neither state_dict/load_state_dict "
                    "nor dumps/loads"
                )
        ckpt_itrs = max(int(checkpoint_interval_steps) // self.frames_per_itr, 1) if checkpoint_interval_steps else 0
        self.checkpoint_interval_itrs = ckpt_itrs or self.log_interval_itrs
        self.stop_return = stop_return

        # Counters (checkpointed). ``itr`` is the iteration being run inside the loop body, and the number of
        # completed iterations outside it.
        self.itr = 0
        self.frames = 0
        self.updates = 0
        self.episodes = 0
        self._train_s = 0.0  # wall time minus evaluation time, summed over (resumed) sessions
        self._eval_s = 0.0
        self._traj_window: deque[dict[str, float]] = deque(maxlen=log_traj_window)
        self._new_trajs: list[dict[str, float]] = []
        self._metrics: list[Mapping[str, Any]] = []
        self._frames_at_log = 0
        self._updates_at_log = 0
        self._train_s_at_log = 0.0
        self.last_eval: dict[str, float] = {}
        self.history: list[dict[str, float]] = []
        self.curve: list[dict[str, float]] = []
        self.resumed = False
        self.stopped_early = False
        self._session_start = 0.0

    # --- What the recipe reads -------------------------------------------------------------------------------

    @property
    def updates_due(self) -> int:
        """Gradient updates this iteration owes: 0 before ``min_steps_learn``, then ``updates_per_itr``."""
        return 0 if self.itr < self.min_itr_learn else self.updates_per_itr

    @property
    def train_s(self) -> float:
        """Wall-clock seconds spent collecting and optimising so far (evaluation excluded)."""
        live = time.perf_counter() - self._session_start if self._session_start else 0.0
        return self._train_s + live - self._session_eval_s

    @property
    def summary(self) -> dict[str, Any]:
        """``summary.json`` content: frames, wall and train seconds, last evaluation, counters, learning curve."""
        out: dict[str, Any] = {
            "frames": self.frames,
            "wall_s": round(self.train_s + self._eval_s + self._session_eval_s, 3),
            "train_s": round(self.train_s, 3),
            "iterations": self.itr,
            "updates": self.updates,
            "episodes": self.episodes,
            "eval/return_mean": self.last_eval.get("eval/return_mean", float("nan")),
        }
        online = episode_stats(list(self._traj_window), prefix="train/")
        if "train/return_mean" in online:
            out["train/return_mean"] = online["train/return_mean"]
        out["stopped_early"] = self.stopped_early
        out["curve"] = self.curve
        return out

    def record(self, metrics: Any = None, *, updates: int = 0) -> None:
        """Store this iteration's optimiser metrics (averaged at the next log row) and count gradient updates.

        Args:
            metrics: a TensorDict or mapping of scalars/tensors, or a sequence of them (e.g. one per update).
                Keys ``loss_x`` are logged as ``loss/x``; other bare keys under ``train/``; keys with a ``/``
                as given.
            updates: gradient updates done this iteration (``CumUpdates``, replay ratio, updates/s).
        """
        self.updates += int(updates)
        if metrics is None:
            return
        if isinstance(metrics, (TensorDictBase, Mapping)):
            self._metrics.append(metrics)
        elif isinstance(metrics, Sequence):
            self._metrics.extend(metrics)
        else:
            raise TypeError(f"record() takes a TensorDict, a mapping or a list of them, got {type(metrics).__name__}")

    # --- The loop --------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[TensorDictBase]:
        completed = False
        self._session_start = time.perf_counter()
        self._session_eval_s = 0.0
        try:
            self._maybe_resume()
            if self.eval_collector is not None and self.itr == 0 and not self.resumed:
                self._evaluate()
                self._log()  # rlpyt's MinibatchRlEval logs the untrained agent at iteration 0
            batches = iter(self.collector)
            while self.itr < self.n_itr and not self.stopped_early:
                # weights reach the collector's workers before every batch, also the first one after a resume
                self.collector.update_policy_weights_()
                batch = next(batches)
                self.frames += batch.numel()
                trajs = new_episodes(self.collector)
                self.episodes += len(trajs)
                self._traj_window.extend(trajs)
                self._new_trajs.extend(trajs)
                yield batch
                self.itr += 1
                if self.itr % self.log_interval_itrs == 0:
                    if self.eval_collector is not None:
                        self._evaluate()
                    self._log()
                    self._check_stop()
                if self.itr % self.checkpoint_interval_itrs == 0 or self.itr >= self.n_itr or self.stopped_early:
                    self._save_checkpoint()
            completed = True
        finally:
            self._train_s = self.train_s
            self._eval_s += self._session_eval_s
            self._session_eval_s = 0.0
            self._session_start = 0.0
            for c in (self.collector, self.eval_collector):
                if c is not None and hasattr(c, "shutdown"):
                    c.shutdown()
            if self.run is not None:
                if completed:
                    self.run.finish(self.summary)
                elif hasattr(self.run, "close"):
                    self.run.close(exit_code=1)  # no summary.json: the run did not finish

    # --- Evaluation, logging, checkpoints -------------------------------------------------------------------

    def _evaluate(self) -> None:
        start = time.perf_counter()
        if hasattr(self.eval_collector, "update_policy_weights_"):
            self.eval_collector.update_policy_weights_()
        trajs = eval_episodes(self.eval_collector)
        self.last_eval = episode_stats(trajs, prefix="eval/")
        self.last_eval["eval/episodes"] = float(len(trajs))
        self._session_eval_s += time.perf_counter() - start

    def _log(self) -> None:
        train_s = self.train_s
        d_frames = self.frames - self._frames_at_log
        d_updates = self.updates - self._updates_at_log
        d_time = max(train_s - self._train_s_at_log, 1e-9)
        metrics: dict[str, float] = {
            "time/train_s": train_s,  # rlpyt's CumTrainTime: wall time minus evaluation
            "time/eval_s": self._eval_s + self._session_eval_s,
            "time/train_fps": d_frames / d_time if self.itr else 0.0,
        }
        metrics.update(episode_stats(list(self._traj_window), prefix="train/"))
        metrics.update(scalar_stats(self._metrics))
        if self.eval_collector is not None:
            metrics.update(self.last_eval)
        new_episodes_count = len(self._new_trajs)
        self._metrics.clear()
        self._new_trajs.clear()
        self._frames_at_log, self._updates_at_log, self._train_s_at_log = self.frames, self.updates, train_s
        counters = {"iteration": self.itr, "frames": self.frames, "updates": self.updates,
                    "episodes": self.episodes, "new_episodes": new_episodes_count}
        if self.batch_size and self.frames:
            counters["replay_ratio"] = d_updates * self.batch_size / max(d_frames, 1)
            counters["cum_replay_ratio"] = self.updates * self.batch_size / self.frames
        self.history.append({**counters, **metrics})
        ret = metrics.get("eval/return_mean", metrics.get("train/return_mean"))
        if ret is not None and math.isfinite(ret):
            self.curve.append({"frames": self.frames, "train_s": round(train_s, 3), "return_mean": ret})
        if self.run is not None:
            self.run.log(metrics, step=self.frames, iteration=self.itr, updates=self.updates,
                         update_batch_size=self.batch_size, episodes=new_episodes_count)

    def _check_stop(self) -> None:
        if self.stop_return is None:
            return
        ret = self.last_eval.get("eval/return_mean") if self.eval_collector is not None else None
        if ret is None:
            ret = episode_stats(list(self._traj_window)).get("return_mean")
        if ret is not None and ret >= self.stop_return:
            self.stopped_early = True

    def state_dict(self) -> dict[str, Any]:
        """Counters, episode window, timers and logged curve: everything the trainer needs to resume."""
        return {
            "itr": self.itr,
            "frames": self.frames,
            "updates": self.updates,
            "episodes": self.episodes,
            "train_s": self.train_s,
            "eval_s": self._eval_s + self._session_eval_s,
            "traj_window": list(self._traj_window),
            "frames_at_log": self._frames_at_log,
            "updates_at_log": self._updates_at_log,
            "train_s_at_log": self._train_s_at_log,
            "last_eval": dict(self.last_eval),
            "curve": list(self.curve),
            "n_itr": self.n_itr,
            "frames_per_itr": self.frames_per_itr,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("frames_per_itr", self.frames_per_itr) != self.frames_per_itr:
            raise ValueError(
                f"checkpoint was taken with {state['frames_per_itr']} frames per iteration, this run has "
                f"{self.frames_per_itr}: the collector's B×T changed"
            )
        self.itr, self.frames = int(state["itr"]), int(state["frames"])
        self.updates, self.episodes = int(state["updates"]), int(state["episodes"])
        self._train_s, self._eval_s = float(state["train_s"]), float(state["eval_s"])
        self._traj_window = deque(state["traj_window"], maxlen=self.log_traj_window)
        self._frames_at_log, self._updates_at_log = int(state["frames_at_log"]), int(state["updates_at_log"])
        self._train_s_at_log = float(state["train_s_at_log"])
        self.last_eval = dict(state["last_eval"])
        self.curve = list(state["curve"])
        # wall time restarts in this session: pretend the session began now
        self._session_start = time.perf_counter()

    def _save_checkpoint(self) -> None:
        if self.run is None:
            return
        state: dict[str, Any] = {name: obj.state_dict() for name, obj in self.checkpoint_state.items()
                                 if name not in self._file_state}
        state["trainer"] = self.state_dict()
        if hasattr(self.collector, "state_dict"):
            state["collector"] = self.collector.state_dict()
        writers = {name: obj.dumps for name, obj in self._file_state.items()}
        # the Run adds the RNG states and its logger position to the checkpoint
        self.run.save_checkpoint(state, self.itr, step=self.frames, extra_writers=writers or None)

    def _maybe_resume(self) -> None:
        if self.run is None or self.resumed:
            return
        readers = {name: obj.loads for name, obj in self._file_state.items()}
        state = self.run.load_checkpoint(extra_readers=readers or None)  # restores RNG states too
        if not state:
            return
        for name, obj in self.checkpoint_state.items():
            if name in self._file_state:
                continue
            if name not in state:
                raise KeyError(f"checkpoint has no '{name}' (it has {sorted(state)})")
            obj.load_state_dict(state[name])
        self.load_state_dict(state["trainer"])
        if "collector" in state and hasattr(self.collector, "load_state_dict"):
            self.collector.load_state_dict(state["collector"])
        self.resumed = True


def _frames_per_batch(collector: Any) -> int:
    for attr in ("frames_per_batch", "frames_per_itr"):
        value = getattr(collector, attr, None)
        if value:
            return int(value)
    b, t = getattr(collector, "batch_B", None), getattr(collector, "batch_T", None)
    if b and t:
        return int(b) * int(t)
    raise ValueError(
        f"cannot tell frames per batch of {type(collector).__name__}: it has no frames_per_batch/batch_B×batch_T; "
        "pass frames_per_itr="
    )
