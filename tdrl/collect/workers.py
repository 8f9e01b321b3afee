"""Worker processes of the parallel and action-server engines, and their supervision.

Each worker owns a contiguous slice of envs and talks to the main process through a duplex ``Pipe`` (per-batch
commands and replies; a worker that raises sends ``("error", traceback)`` and exits), shared-memory TensorDicts
it writes directly and, for the action server, two semaphores per worker for the per-step handshake. The main
process waits on the pipes *and* the process sentinels, so a killed worker is noticed at once; semaphore waits
time out every ``POLL_S`` seconds to check liveness, and workers poll their parent the same way.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.multiprocessing as mp
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.common import CollectorError, sorted_infos
from tdrl.collect.layout import observation_keys
from tdrl.collect.runner import SliceSettings
from tdrl.collect.stepping import env_seed
from tdrl.utils.interrupt import ignore_sigint
from tdrl.utils.process import START_TIMEOUT_S, check_main_guard, close_at_exit

__all__ = ["POLL_S", "WorkerPool", "WorkerSpec", "get_context", "worker_specs"]

POLL_S = 0.25  # how often blocked waits check that the other side is alive
# How long both sides of the action-server handshake poll (yielding the core) before sleeping on the semaphore:
# a step waits tens of microseconds, and polling saves the futex sleep and wake-up a blocking acquire costs.
SPIN_S = 0.0005


@dataclass
class WorkerSpec:
    """Everything a worker needs (pickled once at start; shared-memory tensors stay shared)."""

    rank: int
    lo: int
    hi: int
    settings: SliceSettings
    step_td: TensorDictBase
    batch: TensorDictBase
    policy: TensorDictModuleBase | None = None
    exploration: InteractionType = InteractionType.RANDOM
    compile: bool = False
    obs_ready: Any = None
    actions_ready: Any = None


def worker_specs(settings: SliceSettings, n_procs: int, step_td: TensorDictBase, batch: TensorDictBase,
                 **kwargs: Any) -> list[WorkerSpec]:
    """One spec per worker, each over ``B / n_procs`` contiguous envs; ``kwargs`` are per-worker lists
    (``obs_ready``, ``actions_ready``) or shared values."""
    per = int(batch.batch_size[0]) // n_procs
    return [
        WorkerSpec(w, w * per, (w + 1) * per, settings, step_td, batch,
                   **{k: v[w] if isinstance(v, list) else v for k, v in kwargs.items()})
        for w in range(n_procs)
    ]


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return f"exit code {code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"exit code {code}"


def acquire(sem: Any, check: Callable[[], None]) -> None:
    """Acquire a handshake semaphore: poll it for up to ``SPIN_S`` (``sched_yield`` hands the core to the process
    waited on when they share it), then block, calling ``check`` every ``POLL_S`` to notice a dead peer."""
    deadline = time.perf_counter() + SPIN_S
    while time.perf_counter() < deadline:
        if sem.acquire(False):
            return
        os.sched_yield()
    while not sem.acquire(timeout=POLL_S):
        check()


class _ParentWatch:
    """Lets a blocked worker notice that the main process died or asked it to close (it then exits)."""

    def __init__(self, conn: Connection) -> None:
        self.parent = os.getppid()
        self.conn = conn

    def recv(self) -> Any:
        while not self.conn.poll(POLL_S):
            if os.getppid() != self.parent:
                raise SystemExit(0)
        return self.conn.recv()

    def check(self) -> None:
        if os.getppid() != self.parent or (self.conn.poll() and self.conn.recv()[0] == "close"):
            raise SystemExit(0)


def _worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process: build the slice, then serve commands until ``close``."""
    ignore_sigint()  # Ctrl-C reaches the whole process group; the main process stops us
    torch.set_num_threads(1)
    watch = _ParentWatch(conn)
    runner = None
    try:
        runner = _build_runner(spec)
        conn.send(("ready", os.getpid()))
        _serve_commands(spec, runner, conn, watch)
    except SystemExit:
        pass
    except BaseException:
        _send_quietly(conn, ("error", traceback.format_exc()))
    finally:
        if runner is not None:
            runner.close()
        try:
            conn.close()
        except Exception:
            pass


def _build_runner(spec: WorkerSpec) -> Any:
    """This worker's :class:`~tdrl.collect.runner.SliceRunner`, over a private copy of the step arrays."""
    from tdrl.collect.runner import SliceRunner  # imported here: spawn children import as little as possible

    torch.manual_seed(env_seed(spec.settings.seed, 1_000_000 + spec.rank))
    # The step arrays are written env by env; keep them private to this worker (neighbouring workers' rows share
    # cache lines) except what the action server reads: the observation entries, is_init and the reward (a
    # policy's prev_reward).
    step_td = spec.step_td.clone()
    if spec.obs_ready is not None:
        for key in (*observation_keys(spec.step_td), "is_init", ("next", "reward")):
            step_td.set(key, spec.step_td.get(key))
    return SliceRunner(spec.settings, spec.lo, spec.hi, step_td, spec.batch, spec.policy, spec.exploration,
                       spec.compile)


def _serve_commands(spec: WorkerSpec, runner: Any, conn: Connection, watch: _ParentWatch) -> None:
    """Answer the main process's commands until ``close``."""
    while True:
        cmd = watch.recv()
        kind = cmd[0]
        if kind == "collect":
            conn.send(("done", runner.run_batch(cmd[1])))
            runner.finish_batch()
        elif kind == "serve":
            wait = functools.partial(acquire, check=watch.check)
            conn.send(("done", runner.served_batch(spec.obs_ready, spec.actions_ready, wait)))
            runner.finish_batch()
        elif kind == "get_state":  # between batches: finish_batch above has run
            conn.send(("state", {**runner.state_dict(), "torch_rng": torch.get_rng_state().numpy()}))
        elif kind == "set_state":
            runner.load_state_dict(cmd[1])
            torch.set_rng_state(torch.from_numpy(cmd[1]["torch_rng"]))  # this worker's policy samples from it
            conn.send(("ok",))
        elif kind == "close":
            return
        else:
            raise RuntimeError(f"unknown command {kind!r}")


def _send_quietly(conn: Connection, message: tuple) -> None:
    try:
        conn.send(message)
    except Exception:  # the other side is gone already
        pass


def _stop(proc: Any) -> None:
    """Terminate, then kill, a worker that did not exit when asked."""
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=1.0)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=1.0)


def get_context() -> Any:
    """The multiprocessing context workers start with.

    ``forkserver`` (``spawn`` where it is unavailable) with this module preloaded: the first collector of a process
    pays one import of torch/tensordict in the fork server, every worker after that forks from it in milliseconds.
    Not ``fork``: forking a process that already ran torch ops can deadlock.
    """
    start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        from multiprocessing import forkserver

        ctx.set_forkserver_preload(["tdrl.collect.workers", "tdrl.collect.runner", "tdrl.envs.make"])
        forkserver.ensure_running()  # starts importing now, while the caller builds specs and buffers
    return ctx


class WorkerPool:
    """Starts, supervises and stops the worker processes of one collector (one :class:`WorkerSpec` each)."""

    def __init__(self, specs: Sequence[WorkerSpec]) -> None:
        self.closed = False
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self._pending: dict[int, list[Any]] = {}
        self.ranges = [(spec.lo, spec.hi) for spec in specs]
        check_main_guard("this collector")
        ctx = get_context()
        try:
            for spec in specs:
                parent, child = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=_worker_main, args=(spec, child), name=f"tdrl-collector-worker-{spec.rank}",
                                   daemon=True)
                proc.start()
                child.close()
                self.procs.append(proc)
                self.conns.append(parent)
            _POOLS.add(self)
            self.pids = [reply[1] for reply in self.gather("ready", timeout=START_TIMEOUT_S)]
        except BaseException:
            self.shutdown()
            raise

    @property
    def n(self) -> int:
        return len(self.procs)

    def run_batch(self, command: tuple, serve: Callable[[], None] | None = None) -> list[dict[str, float]]:
        """Send ``command`` to every worker, run ``serve`` (the action server's per-step loop) meanwhile, and return
        the episodes the workers finished, in (step, env) order. Any failure or interruption mid-batch leaves the
        workers out of step with this process: they are stopped before the error propagates."""
        if self.closed:
            raise RuntimeError("collector is shut down")
        try:
            self.send(command)
            if serve is not None:
                serve()
            replies = self.gather("done")
        except BaseException:
            self.shutdown()
            raise
        return sorted_infos([entry for reply in replies for entry in reply[1]])

    def get_state(self) -> list[dict[str, Any]]:
        """Each worker's slice state and torch RNG (between batches)."""
        return [reply[1] for reply in self.call([("get_state",)] * self.n, "state")]

    def set_state(self, states: Sequence[dict[str, Any]]) -> None:
        """Load :meth:`get_state`'s list into the workers of a pool built with the same specs."""
        self.call([("set_state", state) for state in states], "ok")

    def call(self, messages: Sequence[tuple], expect: str) -> list[Any]:
        """Send worker ``r`` ``messages[r]`` and gather the replies; a failure stops the workers (as
        :meth:`run_batch`)."""
        if self.closed:
            raise RuntimeError("collector is shut down")
        try:
            for rank, message in enumerate(messages):
                self.send(message, [rank])
            return self.gather(expect)
        except BaseException:
            self.shutdown()
            raise

    def send(self, message: tuple, ranks: Sequence[int] | None = None) -> None:
        for rank in range(self.n) if ranks is None else ranks:
            try:
                self.conns[rank].send(message)
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.raise_failure(rank)

    def gather(self, expect: str, timeout: float | None = None) -> list[Any]:
        """Wait for one ``expect`` reply from each worker; raise :class:`CollectorError` on a death or error."""
        ranks = list(range(self.n))
        replies: dict[int, Any] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        for r in ranks:
            if self._pending.get(r):
                replies[r] = self._pending[r].pop(0)
        while len(replies) < len(ranks):
            waiting = [r for r in ranks if r not in replies]
            objects = [self.conns[r] for r in waiting] + [self.procs[r].sentinel for r in waiting]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(objects, timeout=left)
            if not ready:
                self.shutdown()
                raise CollectorError(f"workers {waiting} did not reply '{expect}' within {timeout} s")
            for r in waiting:
                message = self._reply(r, ready, expect)
                if message is not None:
                    replies[r] = message
        return [replies[r] for r in ranks]

    def _reply(self, rank: int, ready: list[Any], expect: str) -> Any:
        """Worker ``rank``'s ``expect`` reply if one arrived (``None`` if not yet); raises on a death or error."""
        conn = self.conns[rank]
        if conn in ready or conn.poll():
            try:
                message = conn.recv()
            except (EOFError, ConnectionResetError, OSError):
                self.raise_failure(rank)
            if message[0] == "error":
                self.raise_failure(rank, message[1])
            if message[0] != expect:
                self.shutdown()
                raise CollectorError(f"worker {rank} replied {message[0]!r}, expected {expect!r}")
            return message
        if self.procs[rank].sentinel in ready:
            self.raise_failure(rank)
        return None

    def check(self) -> None:
        """Raise if any worker died or reported an error (used while waiting on semaphores)."""
        for r in range(self.n):
            conn = self.conns[r]
            try:
                if conn.poll():
                    message = conn.recv()
                    if message[0] == "error":
                        self.raise_failure(r, message[1])
                    self._pending.setdefault(r, []).append(message)
            except (EOFError, ConnectionResetError, OSError):
                self.raise_failure(r)
            if not self.procs[r].is_alive():
                self.raise_failure(r)

    def raise_failure(self, rank: int, tb: str | None = None) -> None:
        proc = self.procs[rank]
        if tb is None:
            # A worker can die right after sending its traceback: prefer the traceback when there is one.
            try:
                if self.conns[rank].poll(0.5):
                    message = self.conns[rank].recv()
                    if message[0] == "error":
                        tb = message[1]
            except (EOFError, ConnectionResetError, OSError):
                pass
        proc.join(timeout=1.0)
        if tb is not None:
            text = f"collector worker {rank} (pid {proc.pid}) raised an exception:\n{tb}"
        else:
            text = (
                f"collector worker {rank} (pid {proc.pid}) died with {_signal_name(proc.exitcode)} "
                "without reporting an error (killed, or crashed in native code)"
            )
        self.shutdown()
        raise CollectorError(text)

    def shutdown(self, timeout: float = 2.0) -> None:
        """Ask workers to exit, then terminate/kill stragglers; idempotent."""
        if self.closed:
            return
        self.closed = True
        _POOLS.discard(self)
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if proc.is_alive():
                _send_quietly(conn, ("close",))
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            _stop(proc)
        for conn in self.conns:
            try:
                conn.close()
            except Exception:
                pass


_POOLS = close_at_exit(lambda pool: pool.shutdown(timeout=1.0))
