"""The processes of ``trainer.kind=ray``: collector actors, the hub beside the learner, and the pool that drives them.

Layout (Ape-X, Horgan et al. 2018; IMPALA, Espeholt et al. 2018; weights pulled as in RLlib's ray#63849):

- :class:`CollectorActor` (one Ray actor each, anywhere in the cluster) builds a tdrl collector from the recipe's
  picklable factory, with its own seed. Each :meth:`~CollectorActor.rollout` first pulls the newest weights from the
  hub when their version is newer than its own, then either collects ``[B, T]`` batches and writes them to the
  replay through the hub in one call (``"replay"``: Ape-X; the learner's process never sees them), or collects one
  batch and returns it tagged with the version it acted with (``"unroll"``: IMPALA, whose unroll length is the
  batch's ``T``). An Ape-X call collects for :data:`CALL_MIN_S`, but never more than its share of the frames
  the hub's last reply said the replay would take before its writes wait for the learner (``max_lag_frames``):
  with the default of 0, one batch per call once learning has started.
- :class:`LearnerHub` (one Ray actor pinned to the learner's node) holds the published weights and is the replay's
  only writer. The replay's files are the learner's: the learner samples them and updates priorities in place,
  as the async trainer does, so a sample never crosses a process boundary. Writes wait while the learner is more
  than ``max_lag_frames`` behind its replay ratio, and stop while a checkpoint is taken.
- :class:`tdrl.distributed.actor_pool.ActorPool` (in the learner's process) keeps a bounded number of rollouts in flight
  per actor and replaces dead or stuck actors (a warm spare, else Ray's restart), so a lost node shrinks the set of
  working actors and nothing waits for it.

Ray is imported inside functions: ``tdrl.train`` imports without the ``distributed`` extra.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase

from tdrl.train.schedule import owed_updates
from tdrl.utils.keys import VERSION_KEY

__all__ = ["ActorRuntimeLost", "CollectorActor", "LearnerHub", "RayTrainerError", "Rollout", "actor_seed", "nbytes"]

"""Per-step int64 tag of an unroll: the weights version the actor acted with."""

WRITE_WAIT_S = 1.0
"""Longest a hub write waits for the learner before the actor retries (each call stays short)."""

CALL_MIN_S = 0.05
"""Ape-X: an actor collects whole batches for at least this long per rollout call (one batch when a batch takes
longer), unless its share of the replay's slack (see the module docstring) is collected first, and writes them in
one hub call. Ray's calls cost about 2 ms of CPU per rollout (the actor call, the hub write, their replies), more
than collecting DQN's default batch of 8 CartPole frames; over 50 ms of collection they cost a few %. The reply to
the previous write brings newer weights, loaded between batches as soon as it lands."""


class RayTrainerError(RuntimeError):
    """A collector actor's rollout raised (its traceback is in the message), or the cluster cannot serve the run."""


class ActorRuntimeLost(RayTrainerError):
    """A call into Ray failed inside a collector actor: the runtime under it broke (its node's raylet gone, so its
    socket raises ``OSError: Broken pipe``), not the collector. Raised in place of that error so the pool replaces
    the actor as one that died, where an error of the collector's own stops the run. ``pid``: the actor's process,
    which the pool tells from the restarted one."""

    def __init__(self, message: str, pid: int) -> None:
        super().__init__(message, pid)  # both in args: the exception pickles back to the learner whole
        self.pid = pid

    def __str__(self) -> str:
        return str(self.args[0])


@contextmanager
def ray_runtime_calls() -> Iterator[None]:
    """Wraps an actor's calls into Ray (``get``, ``wait``, ``.remote``): their ``OSError`` or ``RaySystemError``
    becomes :class:`ActorRuntimeLost`. The actor's process can outlive its node's raylet for a moment: a CI run
    that killed a node saw an actor of that node return this error before Ray counted the actor dead."""
    from ray.exceptions import RaySystemError

    try:
        yield
    except (OSError, RaySystemError) as error:
        raise ActorRuntimeLost(f"a call into Ray failed in this actor: {error!r}", os.getpid()) from error


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
    batches: int = 1  # collector batches in the rollout


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

    def _slack(self) -> float:
        """Frames the replay takes before writes wait for the learner: the learner may owe at most
        ``max_lag_frames`` worth of updates (the async trainer's throttle, in frames), plus what is left of the
        warm-up; negative: writes wait. ``inf`` without a throttle."""
        if self.max_lag_frames is None or not self.replay_ratio:
            return math.inf
        assert self.batch_size is not None  # given with replay_ratio (RayTrainer)
        behind = owed_updates(replay_ratio=self.replay_ratio, batch_size=self.batch_size,
                              write_count=self.replay.write_count, samples_drawn=self.replay.samples_drawn,
                              learn_start_frames=self.learn_start_frames,
                              ready=self.replay.ready_count()) * self.batch_size / self.replay_ratio
        return self.max_lag_frames - behind + max(0, self.learn_start_frames - self.replay.write_count)

    def extend(self, wires: list[dict[str, Any]], have: int) -> tuple[bool, tuple[int, list[Any]] | None, float]:
        """Write an actor's batches (:func:`to_wire`, in collection order) into the replay; ``False`` (nothing
        written) if the learner is behind or checkpointing for :data:`WRITE_WAIT_S`, and the actor sends them again.
        Also answers :meth:`weights` for ``have``, saving the actor a call, and the replay's slack after the write."""
        deadline = time.monotonic() + WRITE_WAIT_S
        while True:
            with self._lock:
                if not self._paused and self._slack() >= 0:
                    for wire in wires:
                        self.replay.extend(from_wire(wire))
                    return True, self.weights(have), self._slack()
            if time.monotonic() > deadline:
                return False, self.weights(have), 0.0
            time.sleep(0.005)


class CollectorActor:
    """One collector in its own Ray actor (see the module docstring).

    Args:
        n_actors: the number of working actors (the index of this one comes with each rollout: a spare learns it
            when it takes a dead actor's place).
        factory: ``[ref]``: the object-store reference of the picklable callable building the collector (called
            with ``seed=seed``).
        weights_path: where in the collector's policy the published weights go (``""``: the policy itself).
        hub: the :class:`LearnerHub` handle.
        setup: ``setup(policy, index, n_actors)`` before the first rollout as actor ``index`` (Ape-X's epsilon).
        priorities: ``priorities(policy, batch)``: the ``[B, T]`` initial priorities of a batch for a prioritized
            replay, computed here (Ape-X); ``None``: the replay's default.
        call_timeout_s: timeout of each call to the hub.
    """

    def __init__(self, n_actors: int, factory: list[Any], seed: int, *,
                 weights_path: str, hub: Any, setup: Callable[[Any, int, int], None] | None = None,
                 priorities: Callable[[Any, TensorDictBase], torch.Tensor] | None = None,
                 call_timeout_s: float = 60.0) -> None:
        import ray

        from tdrl.utils.seeding import seed_everything

        torch.set_num_threads(1)
        seed_everything(seed)
        self.n_actors, self.hub, self.call_timeout_s = n_actors, hub, call_timeout_s
        self.setup, self.priorities = setup, priorities
        self.index = -1  # none yet: the first rollout's
        self.collector = ray.get(factory[0], timeout=call_timeout_s)(seed=seed)
        self.policy = self.collector.engine.policy
        self.target = self.policy.get_submodule(weights_path) if weights_path else self.policy
        self.version = -1
        self.slack = 0.0  # frames the replay takes now, from the hub's last reply (none yet: one batch per call)
        self._write: tuple[list[dict], Rollout, Any] | None = None  # the batches sent to the hub, report, reply
        self._held: tuple[list[TensorDictBase], Rollout] | None = None  # collected while a refused write went again
        self.batches = iter(self.collector)
        self.node = ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def _pull_weights(self, newest: tuple[int, list[Any]] | None | Literal["ask"] = "ask") -> int:
        """Load the newest weights (asking the hub unless its answer is given); the bytes they took."""
        import ray

        with ray_runtime_calls():
            if isinstance(newest, str):  # "ask"
                answer: tuple[int, list[Any]] | None = ray.get(self.hub.weights.remote(self.version),
                                                               timeout=self.call_timeout_s)  # LearnerHub.weights
                newest = answer
            if newest is None or newest[0] <= self.version:
                return 0
            version, (ref,) = newest
            weights = from_wire(ray.get(ref, timeout=self.call_timeout_s))
        load_weights(self.target, weights)
        self.collector.update_policy_weights_()
        self.version = version
        return nbytes(weights)

    def _collect(self, calls: bool = False, pending: Any = None) -> tuple[list[TensorDictBase], Rollout]:
        """One batch, or (``calls``: Ape-X) whole batches until :data:`CALL_MIN_S` has passed or the actor's share
        of the replay's slack is collected, each copied out of the collector's reused buffers (they stay in flight
        to the hub while it collects the next); and their report. The reply to ``pending`` (the previous write), as
        soon as it lands, brings newer weights and the slack."""
        import ray

        start, version = time.perf_counter(), self.version  # the oldest weights acted with: the lag reported
        batches: list[TensorDictBase] = []
        trajs: list[dict[str, float]] = []
        frames = pulled = 0
        while True:
            batch = next(self.batches)
            batches.append(batch.clone() if calls else batch)
            trajs += self.collector.traj_infos
            frames += batch.numel()
            if pending is not None and self._landed(pending):
                with ray_runtime_calls():
                    _, newest, self.slack = ray.get(pending, timeout=self.call_timeout_s)
                pulled, pending = pulled + self._pull_weights(newest), None
            if not calls or time.perf_counter() - start >= CALL_MIN_S or frames >= self.slack / self.n_actors:
                break
        report = Rollout(self.index, frames, version, trajs, time.perf_counter() - start,
                         sum(nbytes(b) for b in batches) + pulled, os.getpid(), self.node, batches=len(batches))
        return batches, report

    @staticmethod
    def _landed(ref: Any) -> bool:
        import ray

        with ray_runtime_calls():
            return bool(ray.wait([ref], timeout=0)[0])

    def _send(self, wires: list[dict]) -> Any:
        """The hub's write of ``wires`` (a ref to its reply), sent without waiting."""
        with ray_runtime_calls():
            return self.hub.extend.remote(wires, self.version)

    def _nothing(self) -> Rollout:
        return Rollout(self.index, 0, self.version, [], 0.0, 0, os.getpid(), self.node)

    def rollout(self, mode: str, index: int) -> Rollout:
        """One rollout as actor ``index`` (set up as it when the index is new to this actor). ``"unroll"``: pull
        newer weights, collect a batch and return it tagged with its weights version. ``"replay"``: collect the next
        batches (see :meth:`_collect`) while the hub still writes the previous ones (else after its reply, with the
        weights it brought), settle that write, and send the new batches without waiting; reports the batches whose
        write the hub acknowledged, so the frames counted are in the replay. A refused write (the learner is behind)
        is sent again and the new batches are held for the next call, which collects nothing: every call stays
        short, so a timeout means a stuck actor."""
        import ray

        if index != self.index:
            if self.setup is not None:
                self.setup(self.policy, index, self.n_actors)
            self.index = index
        if mode == "unroll":
            pulled = self._pull_weights()
            (batch,), report = self._collect()
            batch = batch.copy()  # new keys go on a shallow copy: the collector may own this one
            batch.set(VERSION_KEY, torch.full(batch.shape, self.version, dtype=torch.int64))
            report.batch, report.wire_bytes = to_wire(batch), report.wire_bytes + pulled
            return report
        held, self._held = self._held, None
        if held is None and self._write is not None and not self._landed(self._write[2]):
            held = self._collect(calls=True, pending=self._write[2])
        acknowledged = self._nothing()
        if self._write is not None:
            wires, report, pending = self._write
            with ray_runtime_calls():
                accepted, newest, self.slack = ray.get(pending, timeout=self.call_timeout_s)
            report.wire_bytes += self._pull_weights(newest)
            if not accepted:
                self._write, self._held = (wires, report, self._send(wires)), held
                return acknowledged
            acknowledged, self._write = report, None
        elif self.version < 0:
            acknowledged.wire_bytes += self._pull_weights()
        batches, report = held if held is not None else self._collect(calls=True)
        if self.priorities is not None:
            for batch in batches:  # copies of the collector's: theirs to extend
                batch.set("priority", self.priorities(self.policy, batch))
        wires = [to_wire(batch) for batch in batches]  # by value: Ray inlines small ones, puts large ones in its store
        self._write = (wires, report, self._send(wires))
        return acknowledged

    def shutdown(self) -> None:
        self.collector.shutdown()


def actor_seed(seed: int, number: int) -> int:
    """The seed of the pool's ``number``-th actor (spares count on from the working actors): a stream of its own,
    not the learner's."""
    from tdrl.utils.seeding import spawn_seeds

    return spawn_seeds(seed + 1, number + 1)[number]
