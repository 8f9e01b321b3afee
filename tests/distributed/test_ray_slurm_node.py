"""A SLURM task's Ray node dies with the task. SLURM ends a requeued or cancelled task with SIGKILL, and Ray's agents
outlive a killed raylet by a minute or more: tdrl's SLURM Ray nodes must not leave them behind."""

import subprocess
import sys
import time

import pytest

from tests.distributed.cluster import LoopbackCluster, can_make_namespaces

pytestmark = pytest.mark.distributed

TASK = """
import sys, time
from pathlib import Path
from tdrl.launch.ray_slurm import RayPlace, _start_ray
place = RayPlace(node="n1", node_addr="127.0.0.1", head_addr="127.0.0.1", port=6379, n_nodes=1, start="0.0")
_start_ray(place, Path(sys.argv[1]))
time.sleep(600)
"""


def _until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not (ok := predicate()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return bool(ok)


@pytest.mark.timeout(180)
def test_a_task_killed_by_sigkill_takes_every_process_of_its_ray_node_with_it(tmp_path):
    if (why := can_make_namespaces()) is not None:
        pytest.skip(f"Ray loopback cluster: {why}")
    namespace = LoopbackCluster(tmp_path, start=False)
    try:
        task = namespace.popen([sys.executable, "-c", TASK, str(tmp_path / "ray-n1.log")])
        agents = ("ray::RuntimeEnvAgent", "ray::DashboardAgent")
        assert _until(lambda: all(namespace.processes(a) for a in agents), 120), (tmp_path / "ray-n1.log").read_text()
        task.kill()
        task.wait()
        t0 = time.monotonic()
        gone = _until(lambda: not namespace.pids(), 10)
        left = subprocess.run(["ps", "-o", "pid,comm", "-p", ",".join(map(str, namespace.pids())) or "0"],
                              capture_output=True, text=True).stdout
        assert gone, f"Ray processes outlived the task by {time.monotonic() - t0:.0f} s:\n{left}"
    finally:
        assert not namespace.stop()
