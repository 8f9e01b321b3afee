"""The learner's side of ``trainer.kind=ray``'s collector actors: rollouts in flight, deaths, timeouts, a warm spare.

:class:`ActorPool` keeps ``in_flight`` rollouts submitted per actor, so queued data is bounded by construction. A
rollout that raises is an error of the run (never retried into a restart loop), unless what raised is a call into
Ray itself (:class:`~tdrl.distributed.ray_actors.ActorRuntimeLost`: the actor's node going away). Such an actor, one
that dies, or one whose rollouts stop finishing for ``call_timeout_s`` (a lost node), is replaced:

- by the **spare** when one is built: an idle actor that has imported torch and built its collector, and reserves
  no CPU (the dead actor's are freed as it is killed for good). It takes the dead actor's slot, whose index each
  rollout call carries (Ape-X's per-actor epsilon), pulls the weights on its first rollout and collects with its
  own seed; a new spare starts building at once. A restart is then one rollout long. Spares are built once every
  working actor has answered, so they do not slow the start.
- otherwise by Ray, which restarts the same actor (``max_restarts=-1``) where it can place it: a new process that
  imports torch and builds its collector again (4 s on an idle 2-core machine, 8-12 s with both cores busy). A
  spare that is built later takes over a slot still waiting for that restart.

Ray is imported inside functions: ``tdrl.train`` imports without the ``distributed`` extra.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tdrl.distributed.ray_actors import ActorRuntimeLost, RayTrainerError, Rollout

__all__ = ["ActorPool"]

SPARE_FAILURES = 3
"""Spares that may fail to build before the pool stops making them (the next would fail the same way)."""


@dataclass
class _Slot:
    handle: Any
    pending: dict[Any, float] = field(default_factory=dict)  # rollout ref -> submit time
    restarts: int = 0
    frames: int = 0
    collect_s: float = 0.0
    pid: int | None = None
    node: str | None = None
    died_at: float | None = None  # until the slot's first rollout after a death
    progress_at: float = field(default_factory=time.monotonic)  # last rollout finished (or actor started)
    probe: Any = None  # while Ray restarts the actor: a call that returns once it is back
    killed_pid: int | None = None  # the process a kill went to: until the kill lands, it may answer the probe
    started: bool = False  # built its collector (answered once): the start-up timeout no longer applies


@dataclass
class _Spare:
    handle: Any
    probe: Any  # its pid call: answered once its collector is built
    pid: int | None = None


class ActorPool:
    """Drives ``n`` collector actors and ``spares`` idle ones from the learner's process (see the module docstring).

    Args:
        make_actor: ``make_actor(number, spare)`` returns a new actor handle; ``number`` counts every actor the pool
            makes (its seed), ``spare``: an actor that reserves no CPU until it takes a dead actor's place.
        n: number of working actors.
        mode: ``"replay"`` or ``"unroll"`` (see :class:`tdrl.distributed.ray_actors.CollectorActor`).
        in_flight: rollouts submitted ahead per actor (2: an actor never waits for the learner to poll).
        spares: idle actors kept built (0: every replacement is a Ray restart).
        call_timeout_s: an actor with rollouts pending and none finished for this long (the learner's own pauses
            excluded) is replaced.
        start_timeout_s: the same for an actor building its collector (at the start, after a restart).
    """

    def __init__(self, make_actor: Callable[[int, bool], Any], n: int, *, mode: str, in_flight: int = 2,
                 spares: int = 1, call_timeout_s: float = 60.0, start_timeout_s: float = 120.0) -> None:
        self.make_actor, self.mode, self.in_flight, self.call_timeout_s = make_actor, mode, in_flight, call_timeout_s
        self.start_timeout_s, self.n_spares = start_timeout_s, spares
        self.slots = [_Slot(make_actor(i, False)) for i in range(n)]
        self.made = n
        self.spares: list[_Spare] = []
        self.warm = False  # every working actor has answered once
        self.spare_failures = 0
        self._owner: dict[Any, int] = {}
        self._polled_at = time.monotonic()
        self.events: list[str] = []  # one line per restart, for the log
        for i in range(n):
            self._fill(i)

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.slots)

    def _make_spares(self) -> None:
        """Start building spares up to ``spares``, once every working actor has answered the first time: a spare
        built beside them would slow the run's start (a process importing torch) on the cores they need."""
        self.warm = self.warm or all(slot.started for slot in self.slots)
        if not self.warm:
            return
        while len(self.spares) < self.n_spares and self.spare_failures < SPARE_FAILURES:
            handle = self.make_actor(self.made, True)
            self.made += 1
            self.spares.append(_Spare(handle, handle.pid.remote()))

    def _check_spares(self) -> None:
        """Note the spares built since the last call (one line each); drop those that failed to build."""
        import ray
        from ray.exceptions import RayError

        for spare in [s for s in self.spares if s.pid is None]:
            if not ray.wait([spare.probe], timeout=0)[0]:
                continue
            try:
                spare.pid = ray.get(spare.probe, timeout=self.call_timeout_s)
                self.events.append(f"a spare collector actor is ready (pid {spare.pid})")
            except RayError as error:
                self.spares.remove(spare)
                ray.kill(spare.handle, no_restart=True)
                self.spare_failures += 1
                self.events.append(f"a spare collector actor failed to start ({type(error).__name__}); "
                                   f"{'no more spares' if self.spare_failures >= SPARE_FAILURES else 'another'}"
                                   " is made")
        self._make_spares()

    def _ready_spare(self) -> _Spare | None:
        """A built spare, taken out of the list (a new one starts building in its place)."""
        self._check_spares()
        spare = next((s for s in self.spares if s.pid is not None), None)
        if spare is not None:
            self.spares.remove(spare)
            self._make_spares()
        return spare

    def _fill(self, i: int) -> None:
        slot = self.slots[i]
        if slot.probe is not None and not self._back(slot):
            return
        while len(slot.pending) < self.in_flight:
            ref = slot.handle.rollout.remote(self.mode, i)
            slot.pending[ref] = time.monotonic()
            self._owner[ref] = i

    def poll(self, timeout: float) -> list[Rollout]:
        """Rollouts finished within ``timeout`` seconds (at least one unless it elapses), with their actors given
        new work; dead or timed-out actors replaced and counted."""
        import ray

        now = time.monotonic()
        if now - self._polled_at > 1.0:  # the learner was busy (evaluating, checkpointing): no actor's fault
            for slot in self.slots:
                slot.progress_at += now - self._polled_at
        pending = list(self._owner)
        ready, _ = ray.wait(pending, num_returns=1, timeout=timeout) if pending else ([], [])
        if ready:  # take every other finished one too, without waiting
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
        done = [report for ref in ready if (report := self._receive(ref)) is not None]
        self._check_spares()
        now = self._polled_at = time.monotonic()
        for i, slot in enumerate(self.slots):
            timeout = self.call_timeout_s if slot.started else self.start_timeout_s
            if (slot.pending or slot.probe is not None) and now - slot.progress_at > timeout:
                self._replace(i, f"timed out after {timeout:.0f} s", kill=True)
            elif slot.probe is not None and (spare := self._ready_spare()) is not None:
                self._swap_in(i, spare, "still restarting")  # a spare built since: no need to wait for Ray
            self._fill(i)
        return done

    def _receive(self, ref: Any) -> Rollout | None:
        """The finished rollout ``ref`` (``None``: its actor died, and was replaced), with its slot's books."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

        i = self._owner.pop(ref, None)
        if i is None:  # a rollout of an actor that died earlier in this poll
            return None
        slot = self.slots[i]
        slot.pending.pop(ref)
        try:
            report = ray.get(ref, timeout=self.call_timeout_s)
        except RayTaskError as error:
            if isinstance(cause := getattr(error, "cause", None), ActorRuntimeLost):  # killed: Ray restarts it
                slot.pid = cause.pid
                self._replace(i, f"died: {cause}", kill=True)
                return None
            if not isinstance(error, RayActorError):
                raise RayTrainerError(f"collector actor {i} raised in its rollout (not retried):\n{error}") from None
            self._replace(i, "died")
            return None
        except (RayActorError, ActorDiedError, ActorUnavailableError, GetTimeoutError):
            self._replace(i, "died")
            return None
        if slot.pid is not None and report.pid != slot.pid:
            # Ray restarted it between two rollouts: no call of ours failed, so only its pid tells
            slot.restarts += 1
            self.events.append(f"collector actor {i} died (pid {slot.pid}) between rollouts; Ray restarted it: "
                               f"is back after {time.monotonic() - slot.progress_at:.1f} s (pid {report.pid}), "
                               f"restart {slot.restarts}")
        elif slot.died_at is not None:  # the spare's first rollout in this slot
            self.events.append(f"collector actor {i} is back after {time.monotonic() - slot.died_at:.1f} s "
                               f"(the spare, pid {report.pid})")
        slot.died_at, slot.progress_at, slot.started = None, time.monotonic(), True
        slot.frames += report.frames
        slot.collect_s += report.collect_s
        slot.pid, slot.node = report.pid, report.node
        return report

    def _back(self, slot: _Slot) -> bool:
        """Whether an actor Ray restarts is alive again (its probe answered); a failed probe is sent again."""
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
        if pid == slot.killed_pid:  # the process killed, before the kill reached it (ray.kill does not wait)
            slot.probe = slot.handle.pid.remote()
            return False
        slot.probe, slot.started, slot.progress_at, slot.pid = None, True, time.monotonic(), pid
        slot.killed_pid = None
        assert slot.died_at is not None  # set with the probe (_replace)
        index = self.slots.index(slot)
        self.events.append(f"collector actor {index} is back after {time.monotonic() - slot.died_at:.1f} s (pid {pid})")
        slot.died_at = None
        return True

    def _replace(self, i: int, why: str, kill: bool = False) -> None:
        """Forget actor ``i``'s rollouts (they fail with it), count one restart per death, and put the spare in its
        place, or have Ray restart it (``kill``: it still runs, e.g. timed out)."""
        import ray

        slot = self.slots[i]
        for ref in slot.pending:
            self._owner.pop(ref, None)
        slot.pending.clear()
        if slot.probe is not None and not kill:  # still down from the death already counted
            return
        slot.restarts += 1
        slot.died_at = slot.progress_at = time.monotonic()
        if (spare := self._ready_spare()) is not None:
            self._swap_in(i, spare, why)
            return
        if kill:
            slot.killed_pid = slot.pid
            ray.kill(slot.handle, no_restart=False)  # Ray restarts it (where it can be scheduled)
        slot.probe = slot.handle.pid.remote()
        slot.started = False  # the restarted actor gets the start-up timeout to build its collector
        self.events.append(f"collector actor {i} {why} (pid {slot.pid}); Ray restarts it, restart {slot.restarts}")

    def _swap_in(self, i: int, spare: _Spare, why: str) -> None:
        import ray

        slot = self.slots[i]
        ray.kill(slot.handle, no_restart=True)  # its CPUs are freed for the spare, which reserved none
        self.events.append(f"collector actor {i} {why} (pid {slot.pid}); the spare (pid {spare.pid}) takes its "
                           f"place, restart {slot.restarts}")
        slot.handle, slot.pid, slot.probe, slot.started = spare.handle, spare.pid, None, True
        slot.progress_at = time.monotonic()

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
        """Stop every actor and spare (its collector's worker processes first), then kill it for good."""
        import ray

        handles = [s.handle for s in self.slots] + [s.handle for s in self.spares]
        stops = [handle.shutdown.remote() for handle in handles]
        try:
            ray.wait(stops, num_returns=len(stops), timeout=timeout)
        finally:
            for handle in handles:
                ray.kill(handle, no_restart=True)
