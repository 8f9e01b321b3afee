"""A Ray cluster of simulated nodes on loopback, for the tests of ``trainer.kind=ray``.

Every process of it runs in a network namespace the cluster makes (``ip netns``), where the only interface is
loopback: Ray cannot reach, or even see, the machine's own address. Each "node" is a ``ray start --block`` process
(with its raylet, object store and workers) in its own process group, so removing a node is killing that group.
The driver (a recipe) runs in the namespace too, with ``trainer.ray_address``. :meth:`stop` kills what is left and
reports it: after a test, nothing may run in the namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
PORT = 6379  # the namespace is private: the default port is free
ADDRESS = f"127.0.0.1:{PORT}"


def can_make_namespaces() -> str | None:
    """Why this machine cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "needs root to make a network namespace (ip netns)"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip netns)"
    if not Path(RAY).exists():
        return "needs Ray: pip install 'tdrl[distributed]'"
    return None


class LoopbackCluster:
    """A head (no CPUs: the driver's node) and ``n_nodes`` nodes of ``cpus`` CPUs, custom resource ``node<i>``
    (``start=False``: only the namespace)."""

    def __init__(self, workdir: Path, n_nodes: int = 2, cpus: int = 2, object_store_mb: int = 80,
                 start: bool = True) -> None:
        self.workdir = Path(workdir)
        self.ns = f"tdrl-ray-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.nodes: list[subprocess.Popen] = []
        self.token = uuid.uuid4().hex  # this cluster's own token (Ray's default, ~/.ray/auth_token, is shared)
        self.object_store = str(object_store_mb * 2**20)
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        subprocess.run(["ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up"], check=True)
        if not start:  # a bare namespace: a driver there starts Ray itself
            return
        try:
            self._start_node(["--head", f"--port={PORT}", "--num-cpus=0", "--include-dashboard=false"], "head")
            for i in range(1, n_nodes + 1):
                self._start_node([f"--address={ADDRESS}", f"--num-cpus={cpus}",
                                  f"--resources={json.dumps({f'node{i}': 1})}"], f"node{i}")
        except BaseException:
            self.stop()
            raise

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_DISABLE_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": self.token}

    def _start_node(self, args: list[str], name: str) -> None:
        log = open(self.workdir / f"ray-{name}.log", "w")
        cmd = ["ip", "netns", "exec", self.ns, RAY, "start", "--block", "--node-ip-address=127.0.0.1",
               f"--object-store-memory={self.object_store}", "--disable-usage-stats", *args]
        self.nodes.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                           start_new_session=True))
        # one at a time: workers join only a head that is up (ray#8181), and two raylets starting at once on two
        # busy cores can miss Ray's start-up timeout
        self.wait_for_nodes(len(self.nodes))

    def python(self, code: str, timeout: float = 60.0) -> str:
        """Run ``code`` in a fresh Python connected to the cluster; its stdout."""
        out = self.run([sys.executable, "-c", f"import ray; ray.init(address='{ADDRESS}', logging_level='ERROR')\n"
                        + code], timeout=timeout, check=True)
        return out.stdout

    def wait_for_nodes(self, n: int, timeout: float = 60.0) -> None:
        code = ("import time\nt = time.monotonic()\n"
                f"while sum(x['Alive'] for x in ray.nodes()) < {n} and time.monotonic() - t < {timeout}:\n"
                "    time.sleep(0.2)\nprint(sum(x['Alive'] for x in ray.nodes()))")
        deadline = time.monotonic() + timeout
        while True:
            try:
                alive = int(self.python(code, timeout=timeout + 30).split()[-1])
                break
            except (subprocess.CalledProcessError, ValueError):  # the head's GCS is not up yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        dead = [n.args for n in self.nodes if n.poll() is not None]
        if alive < n or dead:
            raise RuntimeError(f"only {alive} of {n} Ray nodes came up (logs in {self.workdir})")

    def run(self, cmd: list[str], *, timeout: float, check: bool = False, env: dict[str, str] | None = None,
            **kwargs) -> subprocess.CompletedProcess:
        """Run ``cmd`` in the namespace (a driver: a recipe with ``trainer.ray_address``), ``env`` added."""
        proc = subprocess.run(["ip", "netns", "exec", self.ns, *cmd], capture_output=True, text=True,
                              timeout=timeout, env={**self.env(), **(env or {})}, **kwargs)
        if check and proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], env=self.env(), start_new_session=True,
                                **kwargs)

    def pids(self) -> list[int]:
        """Every process in the namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def processes(self, title: str) -> list[int]:
        """Processes in the namespace whose command line contains ``title`` (Ray names actors ``ray::Class``)."""
        found = []
        for pid in self.pids():
            try:
                if title in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                    found.append(pid)
            except OSError:
                pass
        return found

    def remove_node(self, i: int) -> None:
        """Kill node ``i`` (1-based) and everything it started: a lost machine."""
        node = self.nodes[i]
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()

    def stop(self) -> list[int]:
        """Kill every node's process group and anything else in the namespace, remove it; what would not die."""
        for node in self.nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
        deadline = time.monotonic() + 10
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:  # a worker forked while its raylet died, re-parented out of the group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        subprocess.run(["ip", "netns", "del", self.ns], check=False)
        return left
