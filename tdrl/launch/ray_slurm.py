"""A Ray cluster over a SLURM job's nodes, for recipes whose driver uses Ray (``trainer.kind=ray``).

Every task of such a job (one per node) calls :func:`ray_node`. The first node's task starts the head (``ray start
--head --block`` on that node's address), waits until every node has joined, sets ``RAY_ADDRESS`` (so the
recipe's ``ray.init()`` connects to it) and runs the driver; the other tasks wait for the head before they start
their worker (ray #8181: workers that start first fail), then stay until the head is gone. Each node's Ray is
stopped when its task leaves, also on an error or a requeue, so no Ray process outlives the job.

The Ray processes ignore SIGUSR2: SLURM sends the preemption signal to every process of the job, and it is the
driver's (submitit checkpoints and requeues), not Ray's, whose daemons would die of it. A node's Ray dies with the
task that started it (the kernel's parent-death signal to a small supervisor that kills Ray's whole process
group): SLURM ends a requeued or cancelled task with SIGKILL, and Ray, which takes SIGTERM as "drain for 30 s",
would otherwise outlive it as orphans that SLURM no longer counts as the job's. Addresses are SLURM's
``NodeAddr``; never Ray's guess, which may be another interface. Ports come from the job id and restart count, so
jobs sharing a node, or a requeued job meeting a stale head, do not collide. Ray's token authentication is on
with a token of this start of the job (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH``: a 0600 file the head task
writes in the run directory, which nodes share, and deletes at the end), unless ``RAY_AUTH_MODE`` is already set.
The object store takes Ray's usual 30 % of the memory SLURM gave the task, not of the whole machine.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tdrl.launch.distributed import first_host, job_port, node_address
from tdrl.utils.process import die_with_parent

__all__ = ["RayPlace", "RaySetupError", "ray_node", "ray_place"]

RAY_PORT_OFFSET = 1
"""Separates the Ray head's port from the torch rendezvous port of the same job."""


class RaySetupError(RuntimeError):
    """The Ray cluster of a job could not start or lost a node; the message names the node and its log."""


@dataclass(frozen=True)
class RayPlace:
    """This task's part in the job's Ray cluster."""

    node: str
    node_addr: str
    head_addr: str
    port: int
    n_nodes: int
    start: str
    """``<job id>.<restart count>``: names this start's token file."""

    @property
    def is_head(self) -> bool:
        """The first node: head and driver."""
        return self.node_addr == self.head_addr

    @property
    def address(self) -> str:
        """``host:port`` of the head's GCS (what ``RAY_ADDRESS`` holds)."""
        return f"{self.head_addr}:{self.port}"


def ray_place() -> RayPlace:
    """This SLURM task's place in the job's Ray cluster.

    Raises:
        RaySetupError: not inside a SLURM task, or more than one task on this node (Ray runs one node per host).
    """
    env = os.environ
    missing = [k for k in ("SLURMD_NODENAME", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_JOB_ID")
               if k not in env]
    if missing:
        raise RaySetupError(f"not inside a SLURM task ({', '.join(missing)} unset); submit with tdrl's SLURM launcher")
    if int(env.get("SLURM_NTASKS_PER_NODE", "1")) != 1 or int(env.get("SLURM_NTASKS", "1")) != int(
            env["SLURM_JOB_NUM_NODES"]):
        raise RaySetupError("a Ray job runs one task per node (Ray's own workers fill the node); use tasks_per_node=1")
    node, head = env["SLURMD_NODENAME"], first_host(env["SLURM_JOB_NODELIST"])
    return RayPlace(node=node, node_addr=node_address(node), head_addr=node_address(head),
                    port=job_port(RAY_PORT_OFFSET), n_nodes=int(env["SLURM_JOB_NUM_NODES"]),
                    start=f"{env['SLURM_JOB_ID']}.{env.get('SLURM_RESTART_COUNT', '0')}")


def _ray_exe() -> str:
    """The ``ray`` command of this interpreter's environment (the job may not have it on PATH)."""
    here = Path(sys.executable).parent / "ray"
    found = str(here) if here.exists() else shutil.which("ray")
    if not found:
        raise RaySetupError("the 'ray' command is not installed here (pip install 'tdrl[distributed]')")
    return found


def _object_store_bytes() -> int | None:
    """Ray's default share (30 %) of the memory SLURM gave this node's task, not of the whole machine's."""
    env = os.environ
    if env.get("SLURM_MEM_PER_NODE"):
        mb = int(env["SLURM_MEM_PER_NODE"])
    elif env.get("SLURM_MEM_PER_CPU"):
        mb = int(env["SLURM_MEM_PER_CPU"]) * len(os.sched_getaffinity(0))
    else:
        return None
    return max(int(mb * 2**20 * 0.3), 100 * 2**20)


_SUPERVISE_RAY = """
import os, signal, subprocess, sys
task = int(sys.argv[1])
signal.signal(signal.SIGHUP, lambda *_: os.killpg(0, signal.SIGKILL))
if os.getppid() != task:  # the task died before the handler was in place
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, lambda *_: None)  # the group's SIGTERM is for 'ray start' (SIG_IGN would be inherited)
code = subprocess.Popen(sys.argv[2:]).wait()
sys.exit(code if code >= 0 else 128 - code)  # a signal's death as a shell reports it
"""
"""Leads the process group of a node's Ray: runs ``ray start`` and, when the task that started it dies (the
kernel's SIGHUP, see :func:`_start_ray`), kills the whole group at once. Ray's own fate sharing is not enough: its
agents outlive a killed raylet by a minute or more (they report the death to a GCS that is gone too)."""


def _supervisor_setup() -> None:
    """Run in the supervisor before exec: ignore SIGUSR2 (inherited by Ray, see the module docstring), and get
    SIGHUP when the task that started it dies (Linux's PR_SET_PDEATHSIG)."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    die_with_parent(signal.SIGHUP)


def _start_ray(place: RayPlace, log: Path) -> subprocess.Popen:
    """``ray start --block`` for this node, in its own session led by :data:`_SUPERVISE_RAY`, so that every Ray
    process of this node dies with the task (SLURM ends a requeued or cancelled task with SIGKILL)."""
    args = [_ray_exe(), "start", "--block", f"--node-ip-address={place.node_addr}", "--disable-usage-stats",
            f"--num-cpus={len(os.sched_getaffinity(0))}"]
    store = _object_store_bytes()
    if store:
        args.append(f"--object-store-memory={store}")
    if place.is_head:
        args += ["--head", f"--port={place.port}", "--include-dashboard=false"]
    else:
        args += [f"--address={place.address}"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-c", _SUPERVISE_RAY, str(os.getpid()), *args], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_supervisor_setup)


def _stop_ray(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop this node's Ray: SIGTERM to its process group (``ray start`` then stops its daemons), SIGKILL to the
    group after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace_s)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:  # the group's other members (daemons, workers) follow
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _port_open(addr: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((addr, port), timeout=2):
        return True
    return False


def _wait(what: str, ready, timeout_s: float, proc: subprocess.Popen | None, log: Path) -> None:
    """Poll ``ready()`` every 0.5 s until true; raise naming ``what`` if ``timeout_s`` passes or ``proc`` dies."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RaySetupError(f"{what}: 'ray start' exited with {proc.returncode}; see {log}")
        if time.monotonic() > deadline:
            raise RaySetupError(f"{what}: not after {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)


_WAIT_FOR_NODES = """
import sys, time, ray
address, want, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout_s
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
while (alive := sum(bool(n["Alive"]) for n in ray.nodes())) < want:
    if time.monotonic() > deadline:
        sys.exit(f"{alive} of {want} Ray nodes joined in {timeout_s:.0f} s")
    time.sleep(0.5)
"""


def _wait_for_nodes(place: RayPlace, timeout_s: float, log: Path) -> None:
    """Wait until every node of the job has joined the head (in a separate driver process, so this one's Ray state
    and signal handlers stay the recipe's)."""
    try:
        out = subprocess.run([sys.executable, "-c", _WAIT_FOR_NODES, place.address, str(place.n_nodes), str(timeout_s)],
                             capture_output=True, text=True, timeout=timeout_s + 60)
    except subprocess.TimeoutExpired:
        raise RaySetupError(f"Ray head {place.address}: no answer in {timeout_s + 60:.0f} s; see {log}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise RaySetupError(f"Ray head {place.address}: {last}; see {log}")


@contextlib.contextmanager
def ray_node(log_dir: str | os.PathLike, timeout_s: float = 180.0) -> Iterator[RayPlace]:
    """Run this task's part of the job's Ray cluster (see the module docstring) around the body.

    The body runs once this node's Ray is up: on the head, once every node has joined, with ``RAY_ADDRESS`` set
    (run the driver there); on a worker node, once its worker started, and leaving the body there waits until the
    head has gone. ``log_dir`` receives each node's ``ray-<node>.log``.

    Raises:
        RaySetupError: the head or a worker did not come up within ``timeout_s``, or this node's Ray died while
            the head was still up.
    """
    place = ray_place()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    log = Path(log_dir) / f"ray-{place.node}.log"
    token = _use_job_token(Path(log_dir) / f".ray-token-{place.start}", create=place.is_head)
    head = f"Ray head {place.address} on {first_host(os.environ['SLURM_JOB_NODELIST'])}"
    if not place.is_head:
        _wait(f"{head}: waiting for it on {place.node}", lambda: _port_open(place.head_addr, place.port),
              timeout_s, None, log)
    proc = _start_ray(place, log)
    try:
        if not place.is_head:
            yield place
            _serve_until_head_leaves(place, proc, log)
            return
        _wait(head, lambda: _port_open(place.head_addr, place.port), timeout_s, proc, log)
        _wait_for_nodes(place, timeout_s, log)
        os.environ["RAY_ADDRESS"] = place.address
        try:
            yield place
        finally:
            os.environ.pop("RAY_ADDRESS", None)
            _disconnect_driver()
    finally:
        _stop_ray(proc)
        if token is not None and place.is_head:
            token.unlink(missing_ok=True)


def _use_job_token(path: Path, create: bool) -> Path | None:
    """Turn on Ray's token authentication with a token for this start of the job (the head task writes it, the
    others find it once the head answers); None, changing nothing, when ``RAY_AUTH_MODE`` is already chosen."""
    if "RAY_AUTH_MODE" in os.environ:
        return None
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob(".ray-token-*"):  # an earlier start's, if it was killed before deleting it
            old.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(path))
    return path


def _serve_until_head_leaves(place: RayPlace, proc: subprocess.Popen, log: Path) -> None:
    """Keep this worker node up while the head answers; raise if the worker dies first."""
    misses = 0
    while misses < 3:  # 3 failed polls in a row: the head has gone
        misses = 0 if _port_open(place.head_addr, place.port) else misses + 1
        if misses == 0 and proc.poll() is not None:
            raise RaySetupError(f"Ray worker on {place.node} exited with {proc.returncode} while the head "
                                f"{place.address} was up; see {log}")
        time.sleep(1.0)


def _disconnect_driver() -> None:
    """Disconnect this process from Ray if the recipe left it connected (before its head goes)."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
