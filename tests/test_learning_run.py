"""The reference runs' plumbing: every sweep file plans, a learning-benchmark row runs as a resumable run
(benchmarks/learning_run.py), an SB3 baseline SIGKILLed mid-run resumes from its checkpoint, and ``learning.py
--runs`` reads the runs back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tdrl.launch import load_sweep, plan_sweep

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import learning  # noqa: E402

SB3_RUN = """
import dataclasses, sys
from pathlib import Path
sys.path.insert(0, {benchmarks!r})
import learning, torch
torch.set_num_threads(1)
task = dataclasses.replace(next(t for t in learning.TASKS if t.name == "sac-pendulum"), budget=800,
                           eval_interval=200, eval_episodes=2, checkpoint_frames=200)
learning.sb3_sac_pendulum(0, task, False, Path(sys.argv[1]))
"""


@pytest.mark.parametrize("sweep_file", sorted((ROOT / "slurm" / "sweeps").glob("*.py")), ids=lambda p: p.stem)
def test_every_sweep_file_plans(sweep_file, tmp_path):
    plan = plan_sweep(load_sweep(sweep_file), root=tmp_path)
    assert plan.runs and all(run.run_dir.is_relative_to(tmp_path) for run in plan.runs)


def test_learning_run_names_an_unknown_task(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning_run.py"), "task=sac-hoper",
                          f"run.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "task='sac-hoper' is not a task of benchmarks/learning.py" in out.stderr and "sac-hopper" in out.stderr


@pytest.mark.timeout(300)
def test_sb3_baseline_resumes_from_its_checkpoint_after_sigkill(tmp_path):
    pytest.importorskip("stable_baselines3")
    script = tmp_path / "sb3_run.py"
    script.write_text(SB3_RUN.format(benchmarks=str(ROOT / "benchmarks")))
    run_dir = tmp_path / "sac-pendulum" / "sb3" / "run_0"
    run_dir.mkdir(parents=True)
    (run_dir / "variant.json").write_text('{"task": "sac-pendulum", "impl": "sb3"}')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        while not (run_dir / "sb3_checkpoint" / "state.pkl").is_file():  # the first checkpoint, at 200 frames
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (run_dir / "summary.json").exists()
    # as if killed while a save swapped checkpoints: only the previous one, under its ".old" name, is left
    (run_dir / "sb3_checkpoint").rename(run_dir / "sb3_checkpoint.old")
    out = subprocess.run([sys.executable, str(script), str(run_dir)], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    resumed_at = int(out.stdout.split("at ")[-1].split(" frames")[0].replace(",", ""))
    assert resumed_at >= 200  # from the checkpoint, not from scratch
    (row,) = learning.rows_from_runs([str(tmp_path)])
    assert row["done"] and (row["task"], row["impl"], row["seed"]) == ("sac-pendulum", "sb3", 0)
    assert [p["frames"] for p in row["curve"]] == [0, 200, 400, 600, 800]  # each evaluation once, none lost
    train_s = [p["train_s"] for p in row["curve"]]
    assert train_s == sorted(train_s)


def test_kept_results_remake_the_report_and_a_relaunch_skips_those_runs(tmp_path):
    """``--keep`` writes the finished runs' evaluations (not their checkpoints) into ``<out>/<sweep>.csv``: the report
    reads the same rows from it unpacked, and unpacked into a machine's runs root the launcher's plan counts those
    runs done."""
    sweep = load_sweep(ROOT / "slurm" / "sweeps" / "mujoco_ppo.py")
    plan = plan_sweep(sweep, root=tmp_path / "runs")
    finished, going = plan.runs[0], plan.runs[1]
    for run, done in ((finished, True), (going, False)):
        run.run_dir.mkdir(parents=True)
        (run.run_dir / "variant.json").write_text(json.dumps(run.variant))
        (run.run_dir / "progress.csv").write_text(
            "CumSteps,time/train_s,eval/return_mean\n0,0.0,-50.5\n25000,31.0,nan\n50000,60.5,812.25\n")
        (run.run_dir / "checkpoint").mkdir()
        if done:
            (run.run_dir / "summary.json").write_text('{"frames": 50000}')
    rows = learning.rows_from_runs([str(plan.exp_dir)])
    (kept,) = learning.keep_results(rows, tmp_path / "kept")
    assert kept == tmp_path / "kept" / f"{plan.exp_dir.name}.csv"
    assert kept.read_text().splitlines() == ["task,impl,seed,CumSteps,time/train_s,eval/return_mean",
                                             "ppo-halfcheetah,tdrl,0,0,0.0,-50.5",
                                             "ppo-halfcheetah,tdrl,0,50000,60.5,812.25"]
    (row,) = learning.rows_from_runs([str(learning.unpack_sweep(kept, tmp_path / "unpacked"))])
    original = next(r for r in rows if r["done"])
    assert {k: v for k, v in row.items() if k != "run_dir"} == {k: v for k, v in original.items() if k != "run_dir"}
    assert row["curve"] == [{"frames": 0, "train_s": 0.0, "return_mean": -50.5},
                            {"frames": 50000, "train_s": 60.5, "return_mean": 812.25}]
    fresh = plan_sweep(sweep, root=tmp_path / "fresh")  # a new machine: the kept runs unpacked into its runs/
    assert learning.unpack_sweep(kept, fresh.exp_dir.parent) == fresh.exp_dir
    assert [run.is_done() for run in fresh.runs[:2]] == [True, False]
