"""The processes of ``trainer.kind=ray``: collector actors, the hub beside the learner, and the pool that drives them.

Layout (Ape-X, Horgan et al. 2018; IMPALA, Espeholt et al. 2018; weights pulled as in RLlib's ray#63849):

- :class:`CollectorActor` (one Ray actor each, anywhere in the cluster) builds a tdrl collector from the recipe's
  picklable factory, with its own seed. Each :meth:`~CollectorActor.rollout` first pulls the newest weights from the
  hub when their version is newer than its own, collects one ``[B, T]`` batch, and then either writes it to the
  replay through the hub (``"replay"``: Ape-X; the learner's process never sees it) or returns it tagged with the
  version it acted with (``"unroll"``: IMPALA).
- :class:`LearnerHub` (one Ray actor pinned to the learner's node) holds the published weights and is the replay's
  only writer. The replay's files are the learner's: the learner samples them and updates priorities in place,
  as the async trainer does, so a sample never crosses a process boundary. Writes wait while the learner is more
  than ``max_lag_frames`` behind its replay ratio, and stop while a checkpoint is taken.
- :class:`ActorPool` (in the learner's process) keeps a bounded number of rollouts in flight per actor, so queued
  data is bounded by construction. A dead actor is restarted by Ray (``max_restarts=-1``) and re-pulls the weights;
  a rollout that raises is an error of the run (never retried into a restart loop); a rollout past its timeout gets
  its actor killed and restarted, so a lost node shrinks the set of working actors and nothing waits for it.

Ray is imported inside functions: ``tdrl.train`` imports without the ``distributed`` extra.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.train.async_collector import owed_updates
from tdrl.utils.keys import VERSION_KEY

__all__ = ["ActorPool", "CollectorActor", "LearnerHub", "RayTrainerError", "Rollout", "nbytes"]

"""Per-step int64 tag of an unroll: the weights version the actor acted with."""

WRITE_WAIT_S = 1.0
"""Longest a hub write waits for the learner before the actor retries (each call stays short)."""


class RayTrainerError(RuntimeError):
    """A collector actor's rollout raised (its traceback is in the message), or the cluster cannot serve the run."""


def nbytes(td: TensorDictBase) -> int:
    """Bytes of a TensorDict's tensors: what a rollout puts on the wire."""
    return sum(t.numel() * t.element_size() for t in td.values(include_nested=True, leaves_only=True))


def to_wire(td: TensorDictBase) -> dict[str, Any]:
    """``td`` as numpy arrays, which Ray serializes without copies (a TensorDict pickles ~30x slower)."""
    leaves = td.items(include_nested=True, leaves_only=True)
    return {"shape": tuple(td.batch_size),
            "data": {key if isinstance(key, tuple) else (key,): value.numpy() for key, value in leaves}}


def from_wire(wire: dict[str, Any]) -> TensorDict:
    """The TensorDict :func:`to_wire` sent (its arrays copied: Ray hands out read-only views)."""
    td = TensorDict({}, batch_size=wire["shape"])
    for key, value in wire["data"].items():
        td.set(key, torch.from_numpy(value.copy()))
    return td


def load_weights(module: torch.nn.Module, weights: TensorDictBase) -> None:
    """Copy ``weights`` (``TensorDict.from_module`` of the learner's module) into ``module`` in place."""
    TensorDict.from_module(module).data.update_(weights)


@dataclass
class Rollout:
    """What a rollout reports to the learner: small, except ``batch`` (unroll mode only)."""

    actor: int
    frames: int
    version: int
    trajs: list[dict[str, float]]
    collect_s: float
    wire_bytes: int
    pid: int
    node: str
    batch: dict[str, Any] | None = None  # "unroll": the batch, as :func:`to_wire` sends it


class LearnerHub:
    """Weights and replay writes, beside the learner (see the module docstring). A threaded actor: a write waiting
    for the learner never blocks a weights pull, a pause or a stop."""

    def __init__(self, replay: Any = None, *, replay_ratio: float | None = None, batch_size: int | None = None,
                 learn_start_frames: int = 0, max_lag_frames: int | None = None) -> None:
        torch.set_num_threads(1)
        self.replay = replay  # unpickled here: the same memmapped files as the learner's buffer
        self.replay_ratio, self.batch_size = replay_ratio, batch_size
        self.learn_start_frames, self.max_lag_frames = learn_start_frames, max_lag_frames
        self._lock = threading.Lock()
        self._paused = False
        self._version = -1
        self._weights: list[Any] = []

    def publish(self, version: int, weights: list[Any]) -> None:
        """Hold ``weights[0]`` (an ObjectRef, wrapped in a list so Ray passes the reference) as ``version``."""
        self._version, self._weights = version, weights

    def weights(self, have: int) -> tuple[int, list[Any]] | None:
        """The newest ``(version, [ref])`` when newer than ``have``, else ``None``."""
        return (self._version, self._weights) if self._version > have else None

    def pause(self) -> int:
        """Stop writes (the running one finishes first) so the learner can checkpoint; the replay's write count."""
        with self._lock:
            self._paused = True
            return self.replay.write_count

    def resume(self) -> None:
        self._paused = False

    def _may_write(self) -> bool:
        if self._paused:
            return False
        if self.max_lag_frames is None or not self.replay_ratio:
            return True
        assert self.batch_size is not None  # given with replay_ratio (RayTrainer)
        # the learner may owe at most max_lag_frames worth of updates: the async trainer's throttle, in frames
        behind = owed_updates(replay_ratio=self.replay_ratio, batch_size=self.batch_size,
                              write_count=self.replay.write_count, samples_drawn=self.replay.samples_drawn,
                              learn_start_frames=self.learn_start_frames,
                              ready=self.replay.ready_count()) * self.batch_size / self.replay_ratio
        return behind <= self.max_lag_frames

    def extend(self, wire: dict[str, Any], have: int) -> tuple[bool, tuple[int, list[Any]] | None]:
        """Write a batch (:func:`to_wire`) into the replay; ``False`` (nothing written) if the learner is behind or
        checkpointing for :data:`WRITE_WAIT_S`, and the actor sends it again. Also answers :meth:`weights` for
        ``have``, saving the actor a call."""
        deadline = time.monotonic() + WRITE_WAIT_S
        while True:
            with self._lock:
                if self._may_write():
                    self.replay.extend(from_wire(wire))
                    return True, self.weights(have)
            if time.monotonic() > deadline:
                return False, self.weights(have)
            time.sleep(0.005)


class CollectorActor:
    """One collector in its own Ray actor (see the module docstring).

    Args:
        index: this actor's number, ``0 .. n_actors - 1``.
        factory: ``[ref]``: the object-store reference of the picklable callable building the collector (called
            with ``seed=seed``).
        weights_path: where in the collector's policy the published weights go (``""``: the policy itself).
        hub: the :class:`LearnerHub` handle.
        setup: ``setup(policy, index, n_actors)`` once after building (e.g. Ape-X's per-actor epsilon).
        priorities: ``priorities(policy, batch)``: the ``[B, T]`` initial priorities of a batch for a prioritized
            replay, computed here (Ape-X); ``None``: the replay's default.
        call_timeout_s: timeout of each call to the hub.
    """

    def __init__(self, index: int, n_actors: int, factory: list[Any], seed: int, *,
                 weights_path: str, hub: Any, setup: Callable[[Any, int, int], None] | None = None,
                 priorities: Callable[[Any, TensorDictBase], torch.Tensor] | None = None,
                 call_timeout_s: float = 60.0) -> None:
        import ray

        from tdrl.utils.seeding import seed_everything

        torch.set_num_threads(1)
        seed_everything(seed)
        self.index, self.hub, self.call_timeout_s, self.priorities = index, hub, call_timeout_s, priorities
        self.collector = ray.get(factory[0], timeout=call_timeout_s)(seed=seed)
        self.policy = self.collector.engine.policy
        self.target = self.policy.get_submodule(weights_path) if weights_path else self.policy
        if setup is not None:
            setup(self.policy, index, n_actors)
        self.version = -1
        self._write: tuple[dict, Rollout, Any] | None = None  # the batch sent to the hub, its report, the reply
        self.batches = iter(self.collector)
        self.node = ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def _pull_weights(self, newest: tuple[int, list[Any]] | None | Literal["ask"] = "ask") -> int:
        """Load the newest weights (asking the hub unless its answer is given); the bytes they took."""
        import ray

        if isinstance(newest, str):  # "ask"
            answer: tuple[int, list[Any]] | None = ray.get(self.hub.weights.remote(self.version),
                                                           timeout=self.call_timeout_s)  # LearnerHub.weights
            newest = answer
        if newest is None:
            return 0
        version, (ref,) = newest
        weights = from_wire(ray.get(ref, timeout=self.call_timeout_s))
        load_weights(self.target, weights)
        self.collector.update_policy_weights_()
        self.version = version
        return nbytes(weights)

    def _collect(self) -> tuple[TensorDictBase, Rollout]:
        start = time.perf_counter()
        batch = next(self.batches)
        collect_s = time.perf_counter() - start
        report = Rollout(self.index, batch.numel(), self.version, list(self.collector.traj_infos), collect_s,
                         nbytes(batch), os.getpid(), self.node)
        return batch, report

    def _nothing(self) -> Rollout:
        return Rollout(self.index, 0, self.version, [], 0.0, 0, os.getpid(), self.node)

    def rollout(self, mode: str) -> Rollout:
        """``"unroll"``: pull newer weights, collect a batch and return it tagged with its weights version.
        ``"replay"``: settle the previous batch's write, collect the next batch and send it to the hub without
        waiting (the write overlaps the next collection); reports the batch whose write the hub acknowledged, so
        the frames counted are in the replay. A refused write (the learner is behind) is sent again by the next
        call, which collects nothing: every call stays short, so a timeout means a stuck actor."""
        import ray

        if mode == "unroll":
            pulled = self._pull_weights()
            batch, report = self._collect()
            batch = batch.copy()  # new keys go on a shallow copy: the collector may own this one
            batch.set(VERSION_KEY, torch.full(batch.shape, self.version, dtype=torch.int64))
            report.batch, report.wire_bytes = to_wire(batch), report.wire_bytes + pulled
            return report
        acknowledged = self._nothing()
        if self._write is not None:
            wire, report, pending = self._write
            accepted, newest = ray.get(pending, timeout=self.call_timeout_s)
            report.wire_bytes += self._pull_weights(newest)
            if not accepted:
                self._write = (wire, report, self.hub.extend.remote(wire, self.version))
                return acknowledged
            acknowledged, self._write = report, None
        elif self.version < 0:
            acknowledged.wire_bytes += self._pull_weights()
        batch, report = self._collect()
        if self.priorities is not None:
            batch = batch.copy().set("priority", self.priorities(self.policy, batch))
        wire = to_wire(batch)  # sent by value: Ray inlines a small batch in the call, puts a large one in its store
        self._write = (wire, report, self.hub.extend.remote(wire, self.version))
        return acknowledged

    def shutdown(self) -> None:
        self.collector.shutdown()


@dataclass
class _Slot:
    handle: Any
    pending: dict[Any, float] = field(default_factory=dict)  # rollout ref -> submit time
    restarts: int = 0
    frames: int = 0
    collect_s: float = 0.0
    pid: int | None = None
    node: str | None = None
    died_at: float | None = None
    progress_at: float = field(default_factory=time.monotonic)  # last rollout finished (or actor started)
    probe: Any = None  # after a death: a call that returns once Ray has the actor back
    started: bool = False  # built its collector (answered once): the start-up timeout no longer applies


class ActorPool:
    """Drives ``n`` collector actors from the learner's process (see the module docstring).

    Args:
        make_actor: ``make_actor(index)`` returns a new actor handle (created with ``max_restarts=-1``).
        n: number of actors.
        mode: ``"replay"`` or ``"unroll"`` (see :class:`CollectorActor`).
        in_flight: rollouts submitted ahead per actor (2: an actor never waits for the learner to poll).
        call_timeout_s: an actor with rollouts pending and none finished for this long (the learner's own pauses
            excluded) is killed and restarted.
        start_timeout_s: the same for an actor building its collector (at the start, after a restart).
    """

    def __init__(self, make_actor: Callable[[int], Any], n: int, *, mode: str, in_flight: int = 2,
                 call_timeout_s: float = 60.0, start_timeout_s: float = 120.0) -> None:
        self.mode, self.in_flight, self.call_timeout_s = mode, in_flight, call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.slots = [_Slot(make_actor(i)) for i in range(n)]
        self._owner: dict[Any, int] = {}
        self._polled_at = time.monotonic()
        self.events: list[str] = []  # one line per restart, for the log
        for i in range(n):
            self._fill(i)

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.slots)

    def _fill(self, i: int) -> None:
        slot = self.slots[i]
        if slot.probe is not None:
            if not self._back(slot):
                return
        while len(slot.pending) < self.in_flight:
            ref = slot.handle.rollout.remote(self.mode)
            slot.pending[ref] = time.monotonic()
            self._owner[ref] = i

    def poll(self, timeout: float) -> list[Rollout]:
        """Rollouts finished within ``timeout`` seconds (at least one unless it elapses), with their actors given
        new work; dead or timed-out actors restarted and counted."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

        now = time.monotonic()
        if now - self._polled_at > 1.0:  # the learner was busy (evaluating, checkpointing): no actor's fault
            for slot in self.slots:
                slot.progress_at += now - self._polled_at
        pending = list(self._owner)
        ready, _ = ray.wait(pending, num_returns=1, timeout=timeout) if pending else ([], [])
        if ready:  # take every other finished one too, without waiting
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
        done = []
        for ref in ready:
            i = self._owner.pop(ref, None)
            if i is None:  # a rollout of an actor that died earlier in this loop
                continue
            slot = self.slots[i]
            slot.pending.pop(ref)
            try:
                report = ray.get(ref, timeout=self.call_timeout_s)
            except RayTaskError as error:
                if isinstance(error, RayActorError):
                    self._restarted(i, "died")
                    continue
                raise RayTrainerError(f"collector actor {i} raised in its rollout (not retried):\n{error}") from None
            except (RayActorError, ActorDiedError, ActorUnavailableError, GetTimeoutError):
                self._restarted(i, "died")
                continue
            if slot.pid is not None and report.pid != slot.pid and slot.probe is None:
                # Ray restarted it between two rollouts: no call of ours failed, so only its pid tells
                slot.restarts += 1
                self.events.append(f"collector actor {i} died (pid {slot.pid}) between rollouts; Ray restarted it: "
                                   f"is back after {time.monotonic() - slot.progress_at:.1f} s (pid {report.pid}), "
                                   f"restart {slot.restarts}")
            slot.progress_at, slot.started = time.monotonic(), True
            slot.frames += report.frames
            slot.collect_s += report.collect_s
            slot.pid, slot.node = report.pid, report.node
            done.append(report)
        now = self._polled_at = time.monotonic()
        for i, slot in enumerate(self.slots):
            timeout = self.call_timeout_s if slot.started else self.start_timeout_s
            if (slot.pending or slot.probe is not None) and now - slot.progress_at > timeout:
                ray.kill(slot.handle, no_restart=False)  # Ray restarts it (where it can be scheduled)
                slot.probe = None
                self._restarted(i, f"timed out after {timeout:.0f} s")
            self._fill(i)
        return done

    def _back(self, slot: _Slot) -> bool:
        """Whether a dead actor is alive again (its probe answered); a failed probe is sent again."""
        import ray
        from ray.exceptions import RayError

        ready, _ = ray.wait([slot.probe], timeout=0)
        if not ready:
            return False
        try:
            pid = ray.get(slot.probe, timeout=self.call_timeout_s)
        except RayError:
            slot.probe = slot.handle.pid.remote()
            return False
        slot.probe, slot.started, slot.progress_at, slot.pid = None, True, time.monotonic(), pid
        assert slot.died_at is not None  # set with the probe (_restarted)
        index = self.slots.index(slot)
        self.events.append(f"collector actor {index} is back after {time.monotonic() - slot.died_at:.1f} s (pid {pid})")
        slot.died_at = None
        return True

    def _restarted(self, i: int, why: str) -> None:
        """Forget actor ``i``'s rollouts (they fail with it) and count one restart per death."""
        slot = self.slots[i]
        for ref in slot.pending:
            self._owner.pop(ref, None)
        slot.pending.clear()
        if slot.probe is not None:  # still down from the death already counted
            return
        slot.probe = slot.handle.pid.remote()
        slot.restarts += 1
        slot.died_at = slot.progress_at = time.monotonic()
        slot.started = False  # the restarted actor gets the start-up timeout to build its collector
        self.events.append(f"collector actor {i} {why} (pid {slot.pid}); Ray restarts it, restart {slot.restarts}")

    def print_events(self) -> None:
        """Print the restart lines gathered since the last call (``tdrl: ...`` on stderr), then forget them."""
        for line in self.events:
            print(f"tdrl: {line}", file=sys.stderr, flush=True)
        self.events.clear()

    def take_fps(self) -> list[float]:
        """Each actor's collection frames/s since the last call (0 for an actor with no rollout since)."""
        fps = [s.frames / s.collect_s if s.collect_s > 0 else 0.0 for s in self.slots]
        for slot in self.slots:
            slot.frames, slot.collect_s = 0, 0.0
        return fps

    def nodes(self) -> int:
        """Distinct cluster nodes the actors' last rollouts ran on."""
        return len({s.node for s in self.slots if s.node is not None})

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every actor (its collector's worker processes first), then kill it for good."""
        import ray

        stops = [s.handle.shutdown.remote() for s in self.slots]
        try:
            ray.wait(stops, num_returns=len(stops), timeout=timeout)
        finally:
            for slot in self.slots:
                ray.kill(slot.handle, no_restart=True)


def actor_seeds(seed: int, n: int) -> Sequence[int]:
    from tdrl.utils.seeding import spawn_seeds

    return spawn_seeds(seed + 1, n)  # not the learner's stream
