"""Async trainer: the collector runs in its own process and fills a shared replay while this process optimises
(rlpyt's AsyncRl / AsyncRlEval), with the replay ratio honoured (astooke/rlpyt#138: rlpyt's async mode did not).

The loop body is the sync trainer's for a trainer given a ``replay`` (``trainer.updates_due`` updates, then
``trainer.record``); here an iteration is one *optimizer round* and yields its ``updates_due`` (no batch).

Throttle: with ``W`` transitions written and ``S`` sampled, a round offers ``floor((replay_ratio * (W -
learn_start) - S) / batch_size)`` updates (at most ``updates_per_sync``), else waits for the next batch, so the
ratio never exceeds its target; ``learn_start`` is ``min_steps_learn`` counted as the sync trainer counts it.
Every update must sample exactly ``batch_size`` transitions. With ``max_lag_frames=0`` the collector collects
batch k+1 while the optimizer trains on batch k and waits while the optimizer owes more than one batch of updates
(rlpyt's double buffer); a larger value lets it run that many frames further ahead, ``None`` never waits (rlpyt's
AsyncRl: the ratio falls when the optimizer is slower). With a bound, the optimizer pays what it owes before every
log row, so each row's ratio is within one minibatch of the target.

At every log or checkpoint boundary the collector pauses while this process evaluates, writes the row (one
consistent snapshot) and the checkpoint (collector state and replay data included). SIGTERM asks the collector
for a boundary after its next batch, where the run checkpoints and stops
(:attr:`~tdrl.train.bookkeeping.Bookkeeper.sigterm`). New weights reach the
collector every ``updates_per_sync`` updates through shared memory, between batches.

Failures: a collector exception or death is raised here as :class:`AsyncTrainerError` within ``POLL_S`` plus the
current round; an exception here stops the collector, and so does this process's death. Use the trainer as a
context manager when the loop body may raise (an abandoned generator is only finalised when the exception's
traceback is released).

Resume: a checkpoint is taken at a boundary, with the collector paused and the optimizer's owed updates paid
(bounded lag), so it holds one consistent state: the collector's (each env's state, the observations, the episodes
in progress, worker RNGs), the collector process's RNGs, the replay's data and sampler, the models, optimizers and
counters, the evaluator's envs. A relaunch restores that state exactly: no episode restarts, and the counters of
every later row (frames, episodes, replay writes; with a bounded lag also updates and replay samples) equal an
uninterrupted run's. What follows is not bitwise: which weights the collector acts with, and hence the data and the
losses, depend on the timing of the two processes, as in any two async runs with the same seed.
"""

from __future__ import annotations

import os
import queue as queue_module
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from tdrl.train.async_collector import POLL_S, CollectorProcessSpec, Control, collector_process_main
from tdrl.train.bookkeeping import frames_per_batch
from tdrl.train.core import TrainerCore
from tdrl.train.protocols import Evaluator, Replay, RunLog
from tdrl.train.schedule import Schedule, owed_updates
from tdrl.train.sync import shutdown
from tdrl.utils.process import START_TIMEOUT_S, close_at_exit
from tdrl.utils.seeding import spawn_seeds

if TYPE_CHECKING:  # annotations only: tdrl.collect imports torchrl.envs (~1 s)
    from tdrl.collect import Collector

__all__ = ["AsyncTrainer", "AsyncTrainerError"]

_LIVE = close_at_exit(lambda trainer: trainer.close())  # closed before multiprocessing joins its children


class AsyncTrainerError(RuntimeError):
    """The collector process failed or died; the message carries its traceback or exit signal."""


def _new_interval() -> dict[str, float]:
    """Per-row accumulators of the collector's reports and of this process's waits."""
    return {"collect_s": 0.0, "lag_wait_s": 0.0, "optimizer_wait_s": 0.0, "frames": 0}


class AsyncTrainer(TrainerCore):
    """Collection in a separate process, optimisation here, throttled to the schedule's replay ratio (see module
    docstring; :class:`~tdrl.train.core.TrainerCore` documents ``schedule``, ``run``, ``eval_collector`` (run here,
    with the optimizer's weights), ``checkpoint_state`` and ``log_traj_window``). The schedule's ``replay_ratio``
    and ``batch_size`` are required: they are the throttle.

    Args:
        collector_factory: picklable callable building the collector *in the collector process*, e.g.
            ``functools.partial(make_collector, "parallel", env_factory, policy, batch_B=8, batch_T=64)`` (whose
            keywords give ``frames_per_itr`` when it is not passed).
        replay: the shared replay buffer (``write_count``, ``samples_drawn``, ``ready_count()``,
            ``dumps``/``loads``); its data goes into every checkpoint.
        policy: the module whose parameters and buffers the collector's policy receives.
        updates_per_sync: gradient updates per round; new weights are published after each round.
        max_lag_frames: how many frames beyond the batch in training the collector may run ahead of the
            optimizer (0: one batch ahead, double buffering); ``None``: no limit (rlpyt).
        seed: run seed; the collector process's RNGs get an independent stream derived from it.
    """

    def __init__(
        self,
        *,
        collector_factory: Callable[[], Collector],
        replay: Replay,
        policy: torch.nn.Module,
        schedule: Schedule,
        run: RunLog | None = None,
        eval_collector: Evaluator | None = None,
        checkpoint_state: Mapping[str, Any] | None = None,
        log_traj_window: int = 100,
        frames_per_itr: int | None = None,
        updates_per_sync: int = 1,
        max_lag_frames: int | None = 0,
        seed: int = 0,
    ) -> None:
        if replay is None:
            raise ValueError("the async trainer needs an off-policy algorithm with a replay buffer (the collector "
                             "process fills it); on-policy algorithms (PPO, A2C) use the sync or ddp trainer")
        replay_ratio, batch_size = schedule.replay_ratio, schedule.batch_size
        if replay_ratio is None or batch_size is None or replay_ratio <= 0 or batch_size < 1:
            raise ValueError(f"the async trainer throttles on replay_ratio and batch_size; got replay_ratio="
                             f"{replay_ratio!r}, batch_size={batch_size!r}")
        if updates_per_sync < 1:
            raise ValueError(f"updates_per_sync must be >= 1, got {updates_per_sync}")
        if max_lag_frames is not None and max_lag_frames < 0:
            raise ValueError(f"max_lag_frames must be >= 0 or None, got {max_lag_frames}")
        super().__init__(schedule=schedule, frames_per_itr=int(frames_per_itr or frames_per_batch(collector_factory)),
                         run=run, eval_collector=eval_collector, checkpoint_state=checkpoint_state, replay=replay,
                         log_traj_window=log_traj_window, update_batch_size=int(batch_size))
        self.collector_factory = collector_factory
        self.replay: Replay = replay
        self.replay_ratio, self.batch_size = float(replay_ratio), int(batch_size)
        self.updates_per_sync = int(updates_per_sync)
        self.max_lag_frames = max_lag_frames
        self.collector_seed = spawn_seeds(seed, 1)[0]
        self._due = 0
        self._idle_rounds = 0
        self._process: Any = None
        self._ctrl: Control | None = None
        self._weights_src = TensorDict.from_module(policy)
        self._boundary_info: dict[str, Any] | None = None
        self._collector_done = False
        self._started = False
        self._collector_state: dict[str, Any] | None = None
        self._collector_rng: dict[str, Any] | None = None
        self._interval = _new_interval()
        self._updates_at_publish = 0
        self._updates_at_version: dict[int, int] = {}
        self._last_version = 0

    @property
    def updates_due(self) -> int:
        """Gradient updates allowed in this round (fixed while the loop body runs)."""
        return self._due

    @property
    def collector_pid(self) -> int | None:
        """Process id of the collector process while it runs."""
        return self._process.pid if self._process is not None else None

    def __iter__(self) -> Iterator[int]:
        return self._session(self._loop)

    def _loop(self) -> Iterator[int]:
        with self.book.paused():  # process start-up is not training time (SyncTrainer gets built collectors)
            self._start_collector()
        self._interval["optimizer_wait_s"] = 0.0
        while True:
            if self.book.sigterm.requested and self._ctrl is not None:
                self._ctrl.boundary.set()  # the collector pauses after its next batch: checkpoint, then stop
            self._drain(block=False)
            at_boundary = self._boundary_info is not None
            if self._collector_done and not at_boundary:
                return
            due = self._owed() if not at_boundary or self.max_lag_frames is not None else 0
            if due > 0:  # at a boundary (bounded lag): pay what the optimizer owes before the row
                yield from self._round(due)
            elif not at_boundary:
                self._drain(block=True)  # throttled: wait for the collector's next batch
            elif self._handle_boundary():
                return

    def _round(self, due: int) -> Iterator[int]:
        self._due = min(due, self.updates_per_sync)
        before = self.replay.samples_drawn
        yield from self._body(self._due)
        drawn = self.replay.samples_drawn - before
        allowed, self._due = self._due * self.batch_size, 0
        if drawn > allowed:
            raise AsyncTrainerError(f"the loop body sampled {drawn} transitions in a round that allowed {allowed} "
                                    f"(updates_due x batch_size={self.batch_size}): sample exactly batch_size per "
                                    "update, or the replay ratio cannot be honoured")
        self._idle_rounds = self._idle_rounds + 1 if drawn == 0 else 0
        if self._idle_rounds >= 1000:  # with a bounded lag the collector would wait for updates that never come
            raise AsyncTrainerError("the loop body did no update in 1000 rounds although updates_due > 0; run "
                                    "trainer.updates_due updates of batch_size samples each round")
        if self.book.updates - self._updates_at_publish >= self.updates_per_sync:
            self._publish_weights()

    def _owed(self) -> int:
        replay = self.replay
        samples = replay.samples_drawn  # read before write_count: S <= ratio * W then holds for the pair
        return owed_updates(replay_ratio=self.replay_ratio, batch_size=self.batch_size,
                            write_count=replay.write_count, samples_drawn=samples,
                            learn_start_frames=self.cadence.learn_start_frames, ready=replay.ready_count())

    def _start_collector(self) -> None:
        ctx = mp.get_context("spawn")
        weights = self._weights_src.data.clone().share_memory_()
        keys = list(self._weights_src.keys(include_nested=True, leaves_only=True))
        self._weight_pairs = [(weights.get(k), self._weights_src.get(k).data) for k in keys]
        self._ctrl = Control(stop=ctx.Event(), go=ctx.Event(), boundary=ctx.Event(), weights=weights,
                             weights_lock=ctx.Lock(),
                             weights_version=ctx.Value("q", 0, lock=False), queue=ctx.Queue())
        self._publish_weights()
        spec = CollectorProcessSpec(
            collector_factory=self.collector_factory, replay=self.replay,
            start_itr=self.book.itr, cadence=self.cadence, replay_ratio=self.replay_ratio, batch_size=self.batch_size,
            max_lag_frames=self.max_lag_frames, seed=self.collector_seed,
            collector_state=self._collector_state, rng=self._collector_rng,
        )
        self._process = ctx.Process(target=collector_process_main, args=(spec, self._ctrl, os.getpid()),
                                    name="tdrl-async-collector", daemon=False)  # non-daemonic: may spawn workers
        self._process.start()
        _LIVE.add(self)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._started:
            if time.monotonic() > deadline:
                raise AsyncTrainerError(f"the collector process did not build its collector within "
                                        f"{START_TIMEOUT_S:.0f} s")
            self._drain(block=True)

    def _publish_weights(self) -> None:
        ctrl = self._ctrl
        assert ctrl is not None  # made before the collector process starts
        with ctrl.weights_lock, torch.no_grad():
            for dst, src in self._weight_pairs:  # plain copies: TensorDict.update_ costs ~100 us per call here
                dst.copy_(src)
            ctrl.weights_version.value += 1
        self._updates_at_version[ctrl.weights_version.value] = self.book.updates
        self._updates_at_publish = self.book.updates

    def _drain(self, *, block: bool) -> None:
        """Handle collector messages; stop at a boundary (the collector is then paused). ``block``: wait for one."""
        assert self._ctrl is not None  # the collector process was started
        queue = self._ctrl.queue
        while True:
            start = time.perf_counter()
            try:
                msg = queue.get(timeout=POLL_S) if block else queue.get_nowait()
            except queue_module.Empty:
                msg = None
            if block:
                self._interval["optimizer_wait_s"] += time.perf_counter() - start
            if msg is None:
                self._check_alive()
                if block:
                    continue
                return
            self._handle(msg)
            if self._boundary_info is not None or self._collector_done or block:
                return

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "started":
            self._started = True
        elif kind == "batch":
            info = msg[1]
            self.book.itr = info["itr"] + 1
            self.book.frames += info["frames"]
            self.book.add_episodes(info["episodes"])
            for key in ("collect_s", "lag_wait_s", "frames"):
                self._interval[key] += info[key]
            self._last_version = info["weights_version"]
            if "collector_state" in info:
                self._boundary_info = info
        elif kind == "done":
            self._collector_done = True
        elif kind == "error":
            self.close()
            raise AsyncTrainerError(f"the collector process failed:\n{msg[1]}")

    def _check_alive(self) -> None:
        process = self._process
        if process is None or process.is_alive() or self._collector_done:
            return
        assert self._ctrl is not None  # made with the process
        try:  # an exception is reported just before the process exits: look for it first
            while True:
                msg = self._ctrl.queue.get(timeout=0.5)
                self._handle(msg)
                if self._collector_done:
                    return
        except queue_module.Empty:
            pass
        code = process.exitcode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        self.close()
        raise AsyncTrainerError(f"the collector process (pid {process.pid}) died with {how} at collector "
                                f"iteration {self.book.itr}; the run stopped")

    def close(self) -> None:
        """Stop the collector process and close the run without ``summary.json`` (an abandoned loop); idempotent."""
        self._close()
        self.book.close_run(None)

    def _close(self) -> None:
        """Stop the collector process (stop flag, then terminate, then kill) and the evaluator; idempotent."""
        process, ctrl = self._process, self._ctrl
        self._process = None
        if process is not None:
            assert ctrl is not None  # made with the process
            ctrl.stop.set()
            ctrl.go.set()
            deadline = time.monotonic() + 10.0
            while process.is_alive() and time.monotonic() < deadline:
                try:
                    while True:
                        ctrl.queue.get_nowait()  # keep the pipe drained so the collector can exit
                except (queue_module.Empty, OSError, ValueError, EOFError):
                    # EOFError: a discarded batch's shared-memory tensors cannot be received once the collector that
                    # sent them has exited (torch hands their fds over a connection to the sender)
                    pass
                process.join(POLL_S)
            for stop in (process.terminate, process.kill):
                if process.is_alive():
                    stop()
                    process.join(3.0)
            ctrl.queue.close()
            ctrl.queue.cancel_join_thread()
        _LIVE.discard(self)
        shutdown(self.eval_collector)

    def __enter__(self) -> AsyncTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _handle_boundary(self) -> bool:
        """Evaluate, log and checkpoint at a paused boundary (:meth:`TrainerCore._boundary`), then release the
        collector. Returns: run over."""
        assert self._boundary_info is not None and self._ctrl is not None  # a boundary the collector reported
        over = self._boundary()  # on SIGTERM it raises: the collector stays paused; close() stops it
        self._boundary_info = None
        if self.stopped_early:
            self._ctrl.stop.set()
        self._ctrl.go.set()
        return over

    def _checkpoint_extra(self) -> dict[str, Any]:
        info = self._boundary_info
        assert info is not None  # checkpoints are taken at a boundary, with the collector paused
        return {"collector": info["collector_state"], "collector_rng": info["rng"]}

    def _restore(self, state: Mapping[str, Any]) -> None:
        self._collector_state, self._collector_rng = state["collector"], state["collector_rng"]

    def _summary_extra(self) -> dict[str, Any]:
        return self._replay_counters()

    def _replay_counters(self) -> dict[str, float]:
        samples = self.replay.samples_drawn
        writes = self.replay.write_count
        learned = writes - self.cadence.learn_start_frames
        return {"replay/ratio": samples / learned if learned > 0 else 0.0, "replay/ratio_target": self.replay_ratio,
                "replay/samples": float(samples), "replay/writes": float(writes)}

    def _row_extra(self) -> dict[str, float]:
        iv = self._interval
        extra = self._replay_counters()
        extra.update({
            "time/collect_s": iv["collect_s"],
            "time/collector_wait_s": iv["lag_wait_s"],
            "time/optimizer_wait_s": iv["optimizer_wait_s"],
            "collector/fps": iv["frames"] / iv["collect_s"] if iv["collect_s"] > 0 else 0.0,
            "collector/policy_lag_updates": float(
                self.book.updates - self._updates_at_version.get(self._last_version, self.book.updates)),
        })
        self._interval = _new_interval()
        self._updates_at_version = {v: u for v, u in self._updates_at_version.items() if v >= self._last_version}
        return extra
