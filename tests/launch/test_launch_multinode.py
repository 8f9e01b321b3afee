"""Two-node SLURM runs on the local cluster's namespace hosts (slurm/local-cluster.sh start --nodes 2): a job spans
both hosts; recipes/ppo.py trainer.kind=ddp with one rank per node equals the same run on this machine, also when
preempted and requeued; a killed rank ends the job quickly, naming it; a Ray cluster over both nodes runs actors on
each and leaves no process behind. Every check of "nothing left" looks inside the nodes' PID namespaces."""

from __future__ import annotations

import io
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kill_checks import assert_same_progress, assert_same_tree, checkpoints, finish, newest_state, progress_rows

from tdrl.launch import Resources, SweepError, load_sweep, plan_sweep, sweep_status
from tdrl.launch.status import format_status
from tdrl.launch.submit import submit_sweep, wait_for_sweep

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_two_nodes")]
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PPO = REPO / "recipes" / "ppo.py"
IMPALA = REPO / "recipes" / "impala.py"
CLUSTER = REPO / "slurm" / "local-cluster.sh"
NET = ipaddress.ip_network(os.environ.get("TDRL_SLURM_NET", "10.87.0") + ".0/24")
# the single-machine ddp test's settings (tests/train/test_ddp.py), 48 iterations, a checkpoint every 8
PPO_DDP = {
    "trainer.kind": "ddp", "trainer.world_size": 2, "logger.wandb": False, "logger.progress_bar": False,
    "collector.batch_B": 2, "collector.batch_T": 32, "collector.total_frames": 6144, "logger.log_interval_steps": 256,
    "checkpoint.interval_steps": 1024, "eval.n_envs": 1, "eval.max_steps": 30, "loss.epochs": 1,
}
TWO_NODES = 'resources=Resources(cpus_per_run=1, time_min=5, partition="multi", nodes=2{extra}),'


def _ppo_plan(write_sweep, name: str, **overrides):
    body = f"seeds=[0],\noverrides={ {**PPO_DDP, **overrides}!r},\n{TWO_NODES.format(extra='')}"
    return plan_sweep(load_sweep(write_sweep(name, body, recipe=PPO)))


def _node_addr(node: str) -> str:
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, check=True)
    return re.search(r"NodeAddr=(\S+)", out.stdout).group(1)


def _node_processes() -> list[str]:
    """``node pid comm args`` of every process on the namespace nodes but their slurmd."""
    out = subprocess.run(["bash", str(CLUSTER), "ps"], capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if line.split()[2:3] != ["slurmd"]]


def _wait_until_gone(job_id: str, timeout_s: float) -> float:
    """Seconds until the job has left the queue (squeue lists finished jobs as COMPLETED/FAILED for a while)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout
        if not out.strip() or out.split()[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still in the queue after {timeout_s:.0f} s")


def _assert_nodes_clean(timeout_s: float = 20.0) -> None:
    """No process but slurmd on either node (slurmstepd may take a moment to go)."""
    deadline = time.monotonic() + timeout_s
    while (left := _node_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "processes left on the nodes:\n" + "\n".join(left)


def _job_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.split()
    return out[0] if out else "GONE"


def _assert_clean_while_requeued(job_id: str, timeout_s: float = 60) -> None:
    """After a requeue, before the job starts again (it waits about 10 s: AuthInfo cred_expire): nothing of its
    first start may be left on the nodes."""
    deadline = time.monotonic() + timeout_s
    while _job_state(job_id) != "PENDING":
        assert time.monotonic() < deadline, f"job {job_id} was not requeued: {_job_state(job_id)}"
        time.sleep(0.1)
    while (left := _node_processes()) and _job_state(job_id) == "PENDING":
        time.sleep(0.2)
    assert not left, "processes of the first start outlived it:\n" + "\n".join(left)


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "launch_events.jsonl").read_text().splitlines()]


def _cancel(subs) -> None:
    ids = sorted({s.job_id.split("_")[0] for s in subs})
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def _submit_and_wait(plan, timeout_s: float = 240):
    subs = submit_sweep(plan, out=io.StringIO())
    try:
        statuses = wait_for_sweep(plan.exp_dir, poll_s=1, timeout_s=timeout_s)
    finally:
        _cancel(subs)
    return subs, statuses


@pytest.mark.timeout(60)
def test_two_node_job_runs_on_two_hosts():
    """The cluster itself: a --nodes 2 job's tasks see different hostnames and addresses, both the nodes'."""
    out = subprocess.run(
        ["srun", "-p", "multi", "-N", "2", "--ntasks-per-node=1", "-t", "1", "bash", "-c",
         'echo "$SLURM_PROCID $SLURM_JOB_NODELIST $(hostname) $(hostname -I)"'],
        capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    rows = sorted(line.split() for line in out.stdout.splitlines())
    assert [r[:3] for r in rows] == [["0", "tdrl-n[1-2]", "tdrl-n1"], ["1", "tdrl-n[1-2]", "tdrl-n2"]]
    assert [r[3:] for r in rows] == [[_node_addr("tdrl-n1")], [_node_addr("tdrl-n2")]]
    assert all(ipaddress.ip_address(r[3]) in NET for r in rows)


@pytest.fixture(scope="module")
def two_node_ppo(tmp_path_factory):
    """recipes/ppo.py trainer.kind=ddp, one rank on each node, uninterrupted; meanwhile the same run with two local
    ranks on this machine (what tests/train/test_ddp.py runs). Returns both run directories and the status."""
    root = tmp_path_factory.mktemp("two_node_ppo")

    def write(name, body, recipe):
        path = root / f"{name}.py"
        path.write_text("from tdrl.launch import Resources, Sweep\n\n"
                        f"sweep = Sweep(name={name!r}, recipe={str(recipe)!r}, root={str(root / 'runs')!r},\n"
                        f"{body})\n")
        return path

    plan = _ppo_plan(write, "ppo_ddp")
    reference = root / "single_machine"
    args = [a for a in plan.runs[0].overrides if not a.startswith("run.dir=")]
    local = subprocess.Popen([sys.executable, str(PPO), *args, f"run.dir={reference}"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    _, statuses = _submit_and_wait(plan)
    finish(local, timeout=180)
    return plan.runs[0].run_dir, reference, statuses[0]


@pytest.mark.timeout(420)
def test_two_node_ppo_ddp_matches_the_single_machine_run(two_node_ppo):
    run_dir, reference, status = two_node_ppo
    assert status.state == "COMPLETED", format_status([status])
    ranks = {e["rank"]: e for e in _events(run_dir) if e["event"] == "rank"}
    assert {r: e["host"] for r, e in ranks.items()} == {0: "tdrl-n1", 1: "tdrl-n2"}  # one rank per host
    masters = {e["master"] for e in ranks.values()}
    assert len(masters) == 1 and masters.pop().startswith(_node_addr("tdrl-n1") + ":")  # rendezvous: n1's address
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
    # the trainer all-gathers the replicas' digests at every log row and fails if they differ: completing through
    # the last row means both ranks ended with the same parameters; here they also equal the single-machine run's
    note = "2-node ddp run vs the same run with 2 ranks on one machine"
    assert_same_progress(reference, run_dir, note)
    assert_same_tree(newest_state(reference), newest_state(run_dir), note)


@pytest.mark.timeout(420)
def test_two_node_ppo_ddp_preempted_requeues_and_ends_bitwise_equal(write_sweep, two_node_ppo):
    uninterrupted = two_node_ppo[0]
    plan = _ppo_plan(write_sweep, "ppo_ddp_preempted")
    subs = submit_sweep(plan, out=io.StringIO())
    run_dir = plan.runs[0].run_dir
    try:
        deadline = time.monotonic() + 180
        while not checkpoints(run_dir):  # preempted after the checkpoint of iteration 8, long before the end
            assert time.monotonic() < deadline, format_status(sweep_status(plan.exp_dir))
            time.sleep(0.1)
        subprocess.run(["scancel", "--signal=USR2", subs[0].job_id], check=True)
        _assert_clean_while_requeued(subs[0].job_id)
        statuses = wait_for_sweep(plan.exp_dir, poll_s=1, timeout_s=240)
        _wait_until_gone(subs[0].job_id, 60)
    finally:
        _cancel(subs)
    assert statuses[0].state == "COMPLETED", format_status(statuses)
    events = _events(run_dir)
    assert [e["event"] for e in events if e["event"] in ("start", "requeue", "end")] == [
        "start", "requeue", "start", "end"]
    ranks = [(e["restart"], e["rank"], e["host"], e["master"]) for e in events if e["event"] == "rank"]
    assert sorted(r[:3] for r in ranks) == [(0, 0, "tdrl-n1"), (0, 1, "tdrl-n2"), (1, 0, "tdrl-n1"), (1, 1, "tdrl-n2")]
    first, second = ({m for s, _, _, m in ranks if s == start} for start in (0, 1))
    assert len(first) == len(second) == 1 and first != second  # both ranks met again, in a fresh store
    log = (run_dir / "debug.log").read_text()
    assert len(re.findall(r"resumed from itr_\d+", log)) == 1, log
    note = "preempted and requeued 2-node run vs the uninterrupted one"
    assert_same_progress(uninterrupted, run_dir, note)
    assert_same_tree(newest_state(uninterrupted), newest_state(run_dir), note)
    _assert_nodes_clean()


@pytest.mark.timeout(300)
def test_killed_rank_fails_the_job_within_60s_naming_it(write_sweep):
    plan = _ppo_plan(write_sweep, "ppo_ddp_killed", **{"collector.total_frames": 10**7})
    subs = submit_sweep(plan, out=io.StringIO())
    run_dir = plan.runs[0].run_dir
    try:
        deadline = time.monotonic() + 180
        while progress_rows(run_dir / "progress.csv") < 3:
            assert time.monotonic() < deadline, format_status(sweep_status(plan.exp_dir))
            time.sleep(0.2)
        rank1 = [int(line.split()[1]) for line in _node_processes()
                 if line.startswith("tdrl-n2 ") and "submitit.core._submit" in line]
        assert rank1, _node_processes()
        for pid in rank1:
            os.kill(pid, signal.SIGKILL)
        took = _wait_until_gone(subs[0].job_id, 90)
    finally:
        _cancel(subs)
    assert took < 60, f"the job took {took:.0f} s to end after its rank 1 was killed"
    status = sweep_status(plan.exp_dir)[0]
    assert status.state == "FAILED" and status.error.startswith("rank 1 on tdrl-n2: Killed"), format_status([status])
    _assert_nodes_clean()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_lost_node_requeues_the_job_which_resumes_when_the_node_is_back(write_sweep, two_node_ppo):
    """tdrl-n2 dies whole (its init is killed: its slurmd, slurmstepd and rank go at once, as in a power loss).
    SLURM notices within SlurmdTimeout (30 s), ends that start (NODE_FAIL) and requeues the job (JobRequeue=1),
    leaving nothing on tdrl-n1; once the node is back the run resumes from its checkpoint and ends bitwise equal to
    the uninterrupted run."""
    plan = _ppo_plan(write_sweep, "ppo_ddp_node_lost")
    subs = submit_sweep(plan, out=io.StringIO())
    run_dir = plan.runs[0].run_dir
    try:
        deadline = time.monotonic() + 180
        while not checkpoints(run_dir):
            assert time.monotonic() < deadline, format_status(sweep_status(plan.exp_dir))
            time.sleep(0.1)
        os.kill(int(Path("/run/tdrl-slurm/tdrl-n2.pid").read_text()), signal.SIGKILL)  # the node's unshare
        t0 = time.monotonic()
        while _job_state(subs[0].job_id) != "PENDING":
            assert time.monotonic() - t0 < 60, f"job still {_job_state(subs[0].job_id)} 60 s after tdrl-n2 died"
            time.sleep(0.5)
        _assert_nodes_clean()  # tdrl-n1 (tdrl-n2 is gone)
        status = sweep_status(plan.exp_dir)[0]  # not FAILED from rank 0's result: it will run again
        assert status.state == "PENDING", format_status([status])
        subprocess.run(["bash", str(CLUSTER), "start", "--nodes", "2"], check=True, capture_output=True, timeout=120)
        statuses = wait_for_sweep(plan.exp_dir, poll_s=1, timeout_s=240)
        _wait_until_gone(subs[0].job_id, 60)
    finally:
        _cancel(subs)
        subprocess.run(["bash", str(CLUSTER), "start", "--nodes", "2"], capture_output=True, timeout=120)
    assert statuses[0].state == "COMPLETED" and statuses[0].starts == 2, format_status(statuses)
    note = "2-node run that lost a node, requeued, vs the uninterrupted one"
    assert_same_progress(two_node_ppo[0], run_dir, note)
    assert_same_tree(newest_state(two_node_ppo[0]), newest_state(run_dir), note)
    _assert_nodes_clean()


@pytest.mark.timeout(300)
def test_impala_on_ray_spans_both_nodes_and_resumes_when_preempted(write_sweep):
    """recipes/impala.py with trainer.kind=ray as a user submits it: a Ray head on tdrl-n1 (the learner's node) and
    a worker on tdrl-n2, one collector actor on each. Preempted with USR2 after its first checkpoint, the learner
    checkpoints, the job requeues on a fresh Ray cluster and resumes where it was (the learner's digest equals the
    checkpoint's). Afterwards no Ray process is left on either node (the nodes outlive jobs). 40,000 frames: each
    start's second actor begins seconds after the first (both start torch and their envs on a 2-core machine), and
    an 8,000-frame run could end before it delivered (actor_nodes counts the actors' last rollouts)."""
    pytest.importorskip("ray")
    overrides = {"trainer.kind": "ray", "trainer.n_actors": 2, "collector.total_frames": 40_000,
                 "logger.log_interval_steps": 4_000, "eval.n_envs": 1, "eval.max_steps": 50, "logger.wandb": False,
                 "logger.progress_bar": False}
    plan = plan_sweep(load_sweep(write_sweep("impala_ray", f"seeds=[0],\noverrides={overrides!r},\n"
                                             + TWO_NODES.format(extra=", ray=True"), recipe=IMPALA)))
    subs = submit_sweep(plan, out=io.StringIO())
    run_dir = plan.runs[0].run_dir
    try:
        deadline = time.monotonic() + 180
        while not checkpoints(run_dir):  # the actors run on both nodes and the learner has checkpointed
            assert time.monotonic() < deadline, format_status(sweep_status(plan.exp_dir))
            time.sleep(0.2)
        subprocess.run(["scancel", "--signal=USR2", subs[0].job_id], check=True)
        _assert_clean_while_requeued(subs[0].job_id)
        statuses = wait_for_sweep(plan.exp_dir, poll_s=1, timeout_s=240)
        _wait_until_gone(subs[0].job_id, 60)
    finally:
        _cancel(subs)
    assert statuses[0].state == "COMPLETED", format_status(statuses)
    events = [e["event"] for e in _events(run_dir) if e["event"] in ("start", "requeue", "end")]
    assert events == ["start", "requeue", "start", "end"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 40_000 and summary["actor_nodes"] == 2, summary
    log = (run_dir / "debug.log").read_text()
    assert "resumed from itr_" in log and "(equal to the checkpoint's)" in log, log[-3000:]
    assert not list(run_dir.glob(".ray-token-*"))  # the job's Ray token is gone with its cluster
    _assert_nodes_clean()


def test_multi_node_requests_that_do_not_fit_fail_before_submission(write_sweep):
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    plan = _ppo_plan(write_sweep, "nofit")
    with pytest.raises(SweepError, match=r"nodes=3 but partition 'multi' has 2 node\(s\); no partition has as many"):
        submit_sweep(plan, Resources(partition="multi", nodes=3), out=io.StringIO())
    with pytest.raises(SweepError, match=r"nodes=2 but partition 'debug' has 1 node\(s\); partitions with 2: multi"):
        submit_sweep(plan, Resources(nodes=2), out=io.StringIO())
    with pytest.raises(SweepError, match=r"trainer.world_size=2 but the job starts nodes=2 x tasks_per_node=2 = 4"):
        submit_sweep(plan, Resources(partition="multi", nodes=2, tasks_per_node=2), out=io.StringIO())
    with pytest.raises(SweepError, match=r"resources.ray with tasks_per_node=2: a Ray run has one task per node"):
        submit_sweep(plan, Resources(partition="multi", nodes=2, tasks_per_node=2, ray=True), out=io.StringIO())
    sweep_file = write_sweep("cli_nofit", f"overrides={PPO_DDP!r},", recipe=PPO)
    proc = subprocess.run([sys.executable, str(REPO / "slurm" / "launch.py"), "slurm", str(sweep_file), "--nodes", "3",
                           "--partition", "multi"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: nodes=3 but partition 'multi' has 2 node(s); no partition has as many"], proc.stderr
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert not set(after) - set(before) and not plan.exp_dir.exists()
