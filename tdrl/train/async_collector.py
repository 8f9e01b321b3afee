"""The collector process of the async trainer, and the control block it shares with the optimizer process.

Per iteration the collector process copies newly published weights into its collector's policy (between
batches), optionally waits for the optimizer (``max_lag_frames``), collects one batch into the shared replay and
reports it; at a log/checkpoint boundary (or the next batch, once the optimizer asks for one: SIGTERM) it also
reports its collector's and RNG's state and pauses until released. It exits when the budget is spent, when asked
to stop, or when the optimizer process disappears. :func:`~tdrl.train.schedule.owed_updates` is the one throttle
both processes use, so they cannot disagree about whether the optimizer may update (which would deadlock a waiting
collector).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tdrl.train.schedule import Cadence, owed_updates
from tdrl.utils.interrupt import ignore_sigint
from tdrl.utils.process import watch_parent
from tdrl.utils.seeding import rng_state, seed_everything, set_rng_state

__all__ = ["CollectorProcessSpec", "Control", "collector_process_main"]

POLL_S = 0.05
"""How often blocked waits check the stop flag and the other process."""


@dataclass
class Control:
    """Shared objects of one optimizer-collector pair: ``stop`` (the optimizer asks the collector to finish), ``go``
    (cleared by the paused collector at a boundary, set to release it), ``boundary`` (the optimizer asks for a
    boundary after the next batch, to checkpoint there), ``weights`` in shared memory with its ``weights_lock`` and
    ``weights_version`` (incremented at each publish), ``queue`` (collector -> optimizer)."""

    stop: Any
    go: Any
    boundary: Any
    weights: Any
    weights_lock: Any
    weights_version: Any
    queue: Any


@dataclass
class CollectorProcessSpec:
    """What the collector process needs, pickled once when it starts (the replay travels as its file paths). It
    pauses after every iteration that completes a log or checkpoint interval, and after the last one; on resume it
    restores ``collector_state`` and ``rng`` (which overrides ``seed``)."""

    collector_factory: Callable[[], Any]
    replay: Any
    start_itr: int
    cadence: Cadence
    replay_ratio: float
    batch_size: int
    max_lag_frames: int | None
    seed: int
    collector_state: dict[str, Any] | None = None
    rng: dict[str, Any] | None = None


orphaned = threading.Event()
"""Set in the collector process when the optimizer process is gone."""


def _must_stop(ctrl: Control) -> bool:
    return ctrl.stop.is_set() or orphaned.is_set()


def collector_process_main(spec: CollectorProcessSpec, ctrl: Control, parent_pid: int) -> None:
    """Entry point of the collector process. Messages on ``ctrl.queue``: ``("started", pid)``; ``("batch", info)``
    per batch (``itr``, ``frames``, ``episodes``, ``collect_s``, ``lag_wait_s``, ``weights_version`` and, at
    boundaries, ``collector_state`` and ``rng``); ``("done",)`` at the end; ``("error", traceback)`` on failure."""
    ignore_sigint()  # Ctrl-C reaches the whole process group; the optimizer process stops us
    finished = threading.Event()

    def stop_orphaned() -> None:  # the loop stops at its next check, else the process is killed
        orphaned.set()
        if not finished.wait(2.0):
            os._exit(1)

    watch_parent(parent_pid, 0.2, stop_orphaned)
    ctrl.queue.cancel_join_thread()  # never block this process's exit on an unread queue
    collector = None
    try:
        torch.set_num_threads(1)  # small policies act fastest on one thread; the optimizer keeps the rest
        seed_everything(spec.seed)
        if spec.rng is not None:
            set_rng_state(spec.rng)
        collector = spec.collector_factory()
        if spec.collector_state is not None:
            collector.load_state_dict(spec.collector_state)
        ctrl.queue.put(("started", os.getpid()))
        _collect_loop(spec, ctrl, collector)
    except BaseException:  # noqa: BLE001 - everything goes to the optimizer, then the process fails
        ctrl.queue.put(("error", traceback.format_exc()))
        finished.set()
        _shutdown(collector)
        time.sleep(0.2)  # let the queue's feeder thread flush the message
        os._exit(1)
    finished.set()
    _shutdown(collector)


def _shutdown(collector: Any) -> None:
    if collector is not None:
        with contextlib.suppress(Exception):  # already failing or exiting
            collector.shutdown()


def _collect_loop(spec: CollectorProcessSpec, ctrl: Control, collector: Any) -> None:
    batches = iter(collector)
    version = 0
    replay = spec.replay
    cadence = spec.cadence
    for itr in range(spec.start_itr, cadence.n_itr):
        if _must_stop(ctrl):
            return
        if ctrl.weights_version.value != version:
            with ctrl.weights_lock:
                version = ctrl.weights_version.value
                collector.update_policy_weights_(ctrl.weights)
        lag_wait_s = _wait_for_optimizer(spec, ctrl) if spec.max_lag_frames is not None else 0.0
        if _must_stop(ctrl):
            return
        start = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            raise RuntimeError(f"the collector stopped after {itr - spec.start_itr} batches, at iteration {itr} of the "
                               f"trainer's {cadence.n_itr}: its own total_frames is smaller than the trainer's n_steps "
                               "(leave it endless, -1)") from None
        collect_s = time.perf_counter() - start
        replay.extend(batch)
        info: dict[str, Any] = {
            "itr": itr, "frames": int(batch.numel()), "episodes": collector.traj_infos, "collect_s": collect_s,
            "lag_wait_s": lag_wait_s, "weights_version": version,
        }
        done = itr + 1
        at_interval = done % cadence.log_interval_itrs == 0 or done % cadence.checkpoint_interval_itrs == 0
        if at_interval or done == cadence.n_itr or ctrl.boundary.is_set():
            info["collector_state"] = collector.state_dict()
            info["rng"] = rng_state()
            ctrl.go.clear()
            ctrl.queue.put(("batch", info))
            while not ctrl.go.wait(POLL_S):
                if _must_stop(ctrl):
                    return
        else:
            ctrl.queue.put(("batch", info))
    ctrl.queue.put(("done",))


def _wait_for_optimizer(spec: CollectorProcessSpec, ctrl: Control) -> float:
    """Block while the optimizer owes more than one batch plus ``max_lag_frames`` frames' worth of updates."""
    assert spec.max_lag_frames is not None  # called only with a bounded lag
    start = time.perf_counter()
    replay = spec.replay
    limit_updates = (spec.max_lag_frames + spec.cadence.frames_per_itr) * spec.replay_ratio / spec.batch_size
    sleep_s = 2e-4
    while not _must_stop(ctrl):
        owed = owed_updates(replay_ratio=spec.replay_ratio, batch_size=spec.batch_size,
                            write_count=replay.write_count, samples_drawn=replay.samples_drawn,
                            learn_start_frames=spec.cadence.learn_start_frames, ready=replay.ready_count())
        if owed <= limit_updates:
            break
        time.sleep(sleep_s)  # back off: polling must not take CPU from the optimizer it waits for
        sleep_s = min(2 * sleep_s, 5e-3)
    return time.perf_counter() - start
