"""SLURM sweeps on the real local cluster (slurm/local-cluster.sh): job arrays, requeue on USR2, failures,
multi-task torch.distributed, and resource checks before submission."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kill_checks import assert_same_progress, assert_same_tree, checkpoints, finish, newest_state, progress_rows

from tdrl.launch import Resources, SweepError, load_sweep, plan_sweep, sweep_status
from tdrl.launch.status import collect_results, format_status
from tdrl.launch.submit import submit_sweep, wait_for_sweep

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _queued(job_ids: list[str]) -> set[str]:
    out = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    return {j for j in job_ids if j in out}


def _cancel(subs) -> None:
    ids = sorted({s.job_id.split("_")[0] for s in subs})
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


@pytest.mark.timeout(240)
def test_sweep_runs_as_a_job_array(write_sweep):
    plan = plan_sweep(
        load_sweep(
            write_sweep(
                "array",
                """
        levels=[VariantLevel(["train.lr"], [[0.01], [0.003]], ["lr1e-2", "lr3e-3"])],
        seeds=[0, 1],
        overrides={"train.iterations": 8},
        resources=Resources(cpus_per_run=1, time_min=5),
        """,
            )
        )
    )
    subs = submit_sweep(plan, out=io.StringIO())
    try:
        array_id = subs[0].job_id.split("_")[0]
        assert [s.job_id for s in subs] == [
            f"{array_id}_{i}" for i in range(4)
        ]  # one array, in plan order
        script = next((plan.exp_dir / "slurm").rglob("*_submission.sh")).read_text()
        assert "#SBATCH --array=0-3%4" in script and "#SBATCH --cpus-per-task=1" in script
        assert "#SBATCH --signal=USR2@" in script and "#SBATCH --time=5" in script
        statuses = wait_for_sweep(plan.exp_dir, poll_s=1, timeout_s=180)
    finally:
        _cancel(subs)
    assert [s.state for s in statuses] == ["COMPLETED"] * 4, format_status(statuses)
    for run, status in zip(plan.runs, statuses, strict=True):
        assert (run.run_dir / "config.json").is_file() and (run.run_dir / "variant.json").is_file()
        with open(run.run_dir / "progress.csv") as f:
            assert [int(r["Iteration"]) for r in csv.DictReader(f)] == list(range(8))
        cfg = json.loads((run.run_dir / "config.json").read_text())
        assert cfg["run"]["seed"] == run.seed and cfg["train"]["lr"] == run.variant["train"]["lr"]
        summary = json.loads((run.run_dir / "summary.json").read_text())
        assert (
            summary["env"]["OMP_NUM_THREADS"] == "1" and len(summary["affinity"]) == 1
        )  # SLURM's 1-CPU binding
        assert status.rows == 8 and status.last_row["frames"] == str(8 * 64) and status.starts == 1
    results = collect_results(plan.exp_dir)
    assert {r["variant/train.lr"] for r in results} == {0.01, 0.003} and all(
        r["frames"] == 512 for r in results
    )
    assert (plan.exp_dir / "results.csv").is_file()


def _uninterrupted_params(overrides: dict) -> str:
    """The final parameter hash of the same run done in one go, in this process."""
    from tdrl.config import apply_overrides
    from tdrl.launch.recipe import load_recipe

    recipe = load_recipe(HERE / "tiny_recipe.py")
    cfg = apply_overrides(
        recipe.Config(), {**overrides, "train.step_sleep_s": 0.0, "run.dir": "reference"}
    )
    return recipe.main(cfg)["param_sha256"]


def _preempt_with_high_priority_job() -> str:
    """Submit a job to partition 'high' that needs every CPU of the node: SLURM preempts the 'debug' job."""
    cpus = subprocess.run(
        ["sinfo", "-h", "-p", "high", "-o", "%c"], capture_output=True, text=True
    ).stdout.split()[0]
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "high",
            "-c",
            cpus.rstrip("+"),
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 1",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["scancel_usr2", "partition_preemption"])
def test_preempted_job_requeues_and_resumes_to_the_same_parameters(write_sweep, how):
    overrides = {"train.iterations": 40, "train.step_sleep_s": 0.15, "run.seed": 3}
    plan = plan_sweep(
        load_sweep(
            write_sweep(
                "preempt",
                f"""
        seeds=[3],
        overrides={overrides!r},
        resources=Resources(cpus_per_run=1, time_min=5, partition="debug"),
        """,
            )
        )
    )
    subs = submit_sweep(plan, out=io.StringIO())
    run_dir = subs[0].run.run_dir
    progress = run_dir / "progress.csv"
    high = []
    try:
        deadline = time.monotonic() + 120
        while not (progress.exists() and len(progress.read_text().splitlines()) > 8):
            assert time.monotonic() < deadline, format_status(sweep_status(plan.exp_dir))
            time.sleep(0.3)
        if how == "scancel_usr2":
            # the preemption signal sent to the job's tasks (not the batch shell), where submitit's handler is
            subprocess.run(["scancel", "--signal=USR2", subs[0].job_id], check=True)
        else:  # real preemption: PreemptType=partition_prio + preempt_send_user_signal send USR2 first
            high.append(_preempt_with_high_priority_job())
        statuses = wait_for_sweep(plan.exp_dir, poll_s=1, timeout_s=200)
    finally:
        _cancel(subs)
        if high:
            subprocess.run(["scancel", *high], capture_output=True)
    assert statuses[0].state == "COMPLETED", format_status(statuses)
    events = [
        json.loads(line) for line in (run_dir / "launch_events.jsonl").read_text().splitlines()
    ]
    assert [e["event"] for e in events] == ["start", "requeue", "start", "end"]
    assert events[2]["restart"] == 1 and statuses[0].starts == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 < summary["resumed_from"] < 40
    assert summary["param_sha256"] == _uninterrupted_params(
        overrides
    )  # bitwise the same final parameters
    with open(progress) as f:
        assert [int(r["Iteration"]) for r in csv.DictReader(f)] == list(
            range(40)
        )  # no duplicated or lost rows


# Pendulum's episodes last 200 steps; every checkpoint (a multiple of 330 frames) falls mid-episode
SAC_OVERRIDES = {
    "collector.total_frames": 3000, "logger.log_interval_steps": 250, "checkpoint.interval_steps": 330,
    "eval.n_envs": 2, "eval.max_steps": 30, "optim.min_steps_learn": 64, "model.hidden_sizes": [16],
    "optim.batch_size": 32, "optim.replay_ratio": 32, "replay.size": 4000, "run.torch_threads": 1,
    "logger.wandb": False, "logger.progress_bar": False,
}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("collector", [  # serial only in the slow suite: parallel also saves worker-held state
    pytest.param({}, id="serial", marks=pytest.mark.slow),
    pytest.param({"collector.kind": "parallel", "collector.batch_B": 2, "collector.n_workers": 2}, id="parallel")])
def test_preempted_real_recipe_requeues_and_ends_bitwise_equal(write_sweep, tmp_path, collector):
    """recipes/sac.py, preempted with USR2 after a checkpoint: requeued, it resumes mid-episode from that checkpoint
    and ends bitwise equal to an uninterrupted run (final checkpoint state, progress.csv minus wall-time columns).
    With a parallel collector the signal reaches its worker processes too."""
    recipe = REPO / "recipes" / "sac.py"
    plan = plan_sweep(load_sweep(write_sweep("sac", f"""
        seeds=[3],
        overrides={ {**SAC_OVERRIDES, **collector}!r},
        resources=Resources(cpus_per_run=1, time_min=5, partition="debug"),
        """, recipe=recipe)))
    subs = submit_sweep(plan, out=io.StringIO())
    run_dir = subs[0].run.run_dir
    reference = tmp_path / "reference"  # the uninterrupted run, on the other core meanwhile
    args = [a for a in plan.runs[0].overrides if not a.startswith("run.dir=")]
    uninterrupted = subprocess.Popen([sys.executable, str(recipe), *args, f"run.dir={reference}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (checkpoints(run_dir) and progress_rows(run_dir / "progress.csv") >= 4):
            assert time.monotonic() < deadline, format_status(sweep_status(plan.exp_dir))
            time.sleep(0.2)
        subprocess.run(["scancel", "--signal=USR2", subs[0].job_id], check=True)
        statuses = wait_for_sweep(plan.exp_dir, poll_s=1, timeout_s=300)
    finally:
        _cancel(subs)
    finish(uninterrupted, timeout=180)
    assert statuses[0].state == "COMPLETED", format_status(statuses)
    events = [json.loads(line)["event"] for line in (run_dir / "launch_events.jsonl").read_text().splitlines()]
    assert events == ["start", "requeue", "start", "end"]
    resumed = re.findall(r"resumed from itr_\d+ \(iteration \d+, ([\d,]+) frames", (run_dir / "debug.log").read_text())
    assert len(resumed) == 1, (run_dir / "debug.log").read_text()
    frames = int(resumed[0].replace(",", ""))
    note = f"preempted SAC run resumed from frame {frames}"
    assert 0 < frames < 3000 and frames % 200, note  # mid-episode
    assert_same_progress(reference, run_dir, note)
    assert_same_tree(newest_state(reference), newest_state(run_dir), note)


@pytest.mark.timeout(240)
def test_a_failing_job_is_reported_with_its_log_and_the_others_finish(write_sweep):
    plan = plan_sweep(
        load_sweep(
            write_sweep(
                "failing",
                """
        levels=[VariantLevel(["train.fail_at_iteration"], [[3], [-1]], ["fails", "ok"])],
        overrides={"train.iterations": 6},
        resources=Resources(cpus_per_run=1, time_min=5),
        """,
            )
        )
    )
    subs = submit_sweep(plan, out=io.StringIO())
    try:
        statuses = wait_for_sweep(plan.exp_dir, poll_s=1, timeout_s=180)
    finally:
        _cancel(subs)
    failed, ok = statuses
    assert failed.state == "FAILED" and ok.state == "COMPLETED"
    assert "RuntimeError: tiny_recipe: failing on purpose at iteration 3" in failed.error
    assert (
        failed.log == str(subs[0].stderr) and "failing on purpose" in Path(failed.log).read_text()
    )
    table = format_status(statuses)
    assert "FAILED" in table and failed.log in table and "1 completed, 1 failed" in table
    assert ok.rows == 6 and (ok.run_dir / "summary.json").is_file()


@pytest.mark.timeout(240)
def test_two_task_job_initialises_torch_distributed_and_all_reduces(write_sweep):
    plan = plan_sweep(
        load_sweep(
            write_sweep(
                "ddp",
                "resources=Resources(cpus_per_run=1, tasks_per_node=2, time_min=5),",
                recipe=HERE / "dist_recipe.py",
            )
        )
    )
    subs = submit_sweep(plan, out=io.StringIO())
    try:
        statuses = wait_for_sweep(plan.exp_dir, poll_s=1, timeout_s=180)
    finally:
        _cancel(subs)
    assert statuses[0].state == "COMPLETED", format_status(statuses)
    run_dir = plan.runs[0].run_dir
    ranks = [json.loads((run_dir / f"rank_{r}.json").read_text()) for r in (0, 1)]
    for r, info in enumerate(ranks):
        assert info["rank"] == r and info["world_size"] == 2 and info["backend"] == "gloo"
        assert info["all_reduce_sum"] == 3.0  # 1 + 2
        assert info["env"]["RANK"] == str(r) and info["env"]["WORLD_SIZE"] == "2"
    assert {p["rank"] for p in ranks[0]["peers"]} == {0, 1}
    assert (
        ranks[0]["peers"][0]["pid"] != ranks[0]["peers"][1]["pid"]
    )  # two processes, one per SLURM task


def test_resources_that_do_not_fit_fail_before_submission(write_sweep):
    plan = plan_sweep(load_sweep(write_sweep("nofit", "seeds=[0],")))
    before = subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    with pytest.raises(SweepError, match=r"unknown SLURM partition 'gpu-a100'; partitions: debug"):
        submit_sweep(plan, Resources(partition="gpu-a100"), out=io.StringIO())
    node = "the largest node of partition 'debug' has"
    too_big = [
        (
            Resources(cpus_per_run=4096),
            rf"cpus_per_run=4096 x tasks_per_node=1 but {node} \d+ CPUs",
        ),
        (Resources(cpus_per_run=1, tasks_per_node=4096), r"x tasks_per_node=4096 but"),
        (Resources(mem_gb=1e6), rf"mem_gb=1000000.0 but {node} [\d.]+ GB"),
        (Resources(gpus_per_run=1), rf"gpus_per_run=1 but {node} 0 GPUs"),
    ]
    for resources, message in too_big:
        with pytest.raises(SweepError, match=message):
            submit_sweep(plan, resources, out=io.StringIO())
    after = subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    # nothing new was queued (a job of an earlier test may have left the queue meanwhile)
    assert not set(after) - set(before) and not plan.exp_dir.exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_time_limit_signal_requeues_and_resumes(write_sweep):
    """The time-out path: SLURM sends USR2 signal_delay_s before the limit, submitit counts it as a time-out."""
    overrides = {"train.iterations": 500, "train.step_sleep_s": 0.2, "run.seed": 5}
    plan = plan_sweep(
        load_sweep(
            write_sweep(
                "timeout",
                f"""
                seeds=[5],
                overrides={overrides!r},
                resources=Resources(cpus_per_run=1, time_min=2, signal_delay_s=60, partition="debug"),
                """,
            )
        )
    )
    subs = submit_sweep(plan, out=io.StringIO())
    try:
        statuses = wait_for_sweep(plan.exp_dir, poll_s=2, timeout_s=500)
    finally:
        _cancel(subs)
    assert statuses[0].state == "COMPLETED", format_status(statuses)
    run_dir = subs[0].run.run_dir
    events = [
        json.loads(x)["event"] for x in (run_dir / "launch_events.jsonl").read_text().splitlines()
    ]
    assert events.count("requeue") >= 1 and events[-1] == "end"
    assert "this job is timed-out" in Path(subs[0].stderr).read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] > 0
    assert summary["param_sha256"] == _uninterrupted_params(overrides)
