"""Multi-node plumbing without a cluster: the rendezvous from SLURM's variables, the port after a requeue, the rank
srun reports failing, the Ray node's place, and run layouts refused before submission."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tdrl.launch import Resources, SweepError, load_sweep, plan_sweep
from tdrl.launch.distributed import first_host, job_port, node_address, slurm_dist_env
from tdrl.launch.job import record_event
from tdrl.launch.ray_slurm import _SUPERVISE_RAY, RaySetupError, _stop_ray, _supervisor_setup, ray_place
from tdrl.launch.status import START_MARKER, first_failed_task, ranks_on_hosts
from tdrl.launch.submit import check_run_layout

SLURM_TASK = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODEID": "1", "SLURM_LOCALID": "0",
              "SLURM_JOB_NODELIST": "tdrl-n[1-2]", "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2",
              "SLURMD_NODENAME": "tdrl-n2"}


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """An ``scontrol`` on PATH that knows tdrl-n1 at 10.9.0.11 and tdrl-n2 at 10.9.0.12."""
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    script.write_text('#!/bin/sh\ncase "$4" in tdrl-n1) a=10.9.0.11;; tdrl-n2) a=10.9.0.12;; *) exit 1;; esac\n'
                      'echo "NodeName=$4 Arch=x86_64 NodeAddr=$a NodeHostName=$4"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)


def test_rendezvous_is_the_first_nodes_address_whatever_the_environment_inherited(fake_scontrol, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # copied by sbatch from the shell that submitted the job
    monkeypatch.setenv("MASTER_PORT", "29500")
    place = slurm_dist_env()
    assert (place.rank, place.world_size, place.node_rank) == (1, 2, 1)
    assert place.master_addr == "10.9.0.11" and place.master_port == job_port() != 29500
    assert first_host("tdrl-n[1-2]") == "tdrl-n1" and node_address("unknown-host") == "unknown-host"


def test_node_address_is_the_host_name_without_scontrol(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert node_address("gpu03") == "gpu03"


def test_the_rendezvous_port_is_new_after_a_requeue_and_per_service(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    first = job_port()
    assert job_port() == first and 20000 <= first < 60000  # every task of one start computes the same
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert job_port() != first and job_port(1) != job_port()


def test_the_first_rank_srun_reports_failing_since_the_last_start():
    log = "\n".join([
        f"{START_MARKER} 0 on tdrl-n1", "srun: error: tdrl-n1: task 0: Exited with exit code 255",  # a requeue
        f"{START_MARKER} 1 on tdrl-n1", "[rank0]: RuntimeError: Connection reset by peer",
        "srun: error: tdrl-n2: task 1: Killed", "srun: launch/slurm: _step_signal: Terminating StepId=42.0",
        "srun: error: tdrl-n1: task 0: Exited with exit code 1",
    ])
    assert first_failed_task(log) == "rank 1 on tdrl-n2: Killed"
    several = "srun: error: n3: tasks 2-3: Exited with exit code 1"
    assert first_failed_task(several) == "ranks 2-3 on n3: Exited with exit code 1"
    assert first_failed_task(f"{START_MARKER} 0 on vm\nall fine\n") == ""
    lost = "srun: error: tdrl-n1: task 0: Exited with exit code 1\nsrun: error: Node failure on tdrl-n2\n"
    assert first_failed_task(lost, {"tdrl-n1": [0], "tdrl-n2": [1]}) == "rank 1 on tdrl-n2: node failure"
    assert first_failed_task(lost) == "node tdrl-n2: node failure"


def test_ranks_on_hosts_are_those_of_the_last_start(tmp_path):
    record_event(tmp_path, "rank", rank=0, host="a", restart=0)
    record_event(tmp_path, "rank", rank=1, host="b", restart=0)
    record_event(tmp_path, "rank", rank=1, host="a", restart=1)
    with open(tmp_path / "launch_events.jsonl", "a") as f:
        f.write('{"event": "rank", "ra')  # cut short by a kill
    assert ranks_on_hosts(tmp_path) == {"a": [0, 1]}


def test_ray_place_names_head_and_worker(fake_scontrol, monkeypatch):
    worker = ray_place()
    assert (worker.node, worker.node_addr, worker.n_nodes, worker.is_head) == ("tdrl-n2", "10.9.0.12", 2, False)
    assert worker.address == f"10.9.0.11:{worker.port}" and worker.port != job_port()  # not the torch rendezvous
    monkeypatch.setenv("SLURMD_NODENAME", "tdrl-n1")
    assert ray_place().is_head
    monkeypatch.setenv("SLURM_NTASKS", "4")
    with pytest.raises(RaySetupError, match="one task per node"):
        ray_place()
    monkeypatch.delenv("SLURMD_NODENAME")
    with pytest.raises(RaySetupError, match=r"not inside a SLURM task \(SLURMD_NODENAME unset\)"):
        ray_place()


def test_a_ddp_world_size_that_differs_from_the_jobs_ranks_is_refused(write_sweep):
    ppo = Path(__file__).resolve().parents[2] / "recipes" / "ppo.py"
    plan = plan_sweep(load_sweep(write_sweep("layout", "overrides={'trainer.kind': 'ddp', 'trainer.world_size': 2},",
                                             recipe=ppo)))
    assert check_run_layout(plan, Resources(nodes=2)) == [False]
    assert check_run_layout(plan, Resources(nodes=2, ray=True)) == [True]
    assert check_run_layout(plan, Resources(nodes=1, tasks_per_node=1)) == [False]  # one task: it spawns its ranks
    with pytest.raises(SweepError, match=r"run 'run_0': trainer.world_size=2 but the job starts nodes=3 x "
                                         r"tasks_per_node=1 = 3 ranks; make them equal"):
        check_run_layout(plan, Resources(nodes=3))
    sync = plan_sweep(load_sweep(write_sweep("sync", "seeds=[0],", recipe=ppo)))
    with pytest.raises(SweepError, match=r"trainer.kind=sync is one process, but the job starts nodes=2 x "
                                         r"tasks_per_node=1 tasks; use trainer.kind=ddp trainer.world_size=2"):
        check_run_layout(sync, Resources(nodes=2))


def _ignored(pid: int) -> set[int]:
    mask = int(next(line for line in open(f"/proc/{pid}/status") if line.startswith("SigIgn")).split()[1], 16)
    return {sig for sig in (signal.SIGTERM, signal.SIGUSR2) if mask & (1 << (sig - 1))}


def test_the_ray_supervisor_leaves_sigterm_to_ray_and_keeps_sigusr2_from_it():
    """What runs under the supervisor (``ray start`` and, through it, Ray's daemons) ignores SIGUSR2 (SLURM's
    preemption signal is the driver's) but not SIGTERM, which stops it; the supervisor exits as a shell reports a
    death by signal."""
    node = subprocess.Popen([sys.executable, "-c", _SUPERVISE_RAY, str(os.getpid()), "sleep", "60"],
                            start_new_session=True, preexec_fn=_supervisor_setup)
    try:
        deadline = time.monotonic() + 30
        while not (child := subprocess.run(["pgrep", "-P", str(node.pid)], capture_output=True, text=True).stdout):
            assert time.monotonic() < deadline, "the supervisor did not start its child"
            time.sleep(0.05)
        assert _ignored(int(child.split()[0])) == {signal.SIGUSR2}
        _stop_ray(node, grace_s=10)
        assert node.returncode == 128 + signal.SIGTERM
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
