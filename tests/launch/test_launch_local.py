"""The local launcher: runs queued over slots, pinned and given the slot's environment; a failing run; root files."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tdrl.launch import launch_local, load_sweep, make_slots, plan_sweep, sweep_status

LAUNCH = Path(__file__).resolve().parents[2] / "slurm" / "launch.py"


def _two_cores() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0))[:2])


@pytest.mark.timeout(240)
def test_sweep_is_queued_over_slots_pinned_and_recorded(write_sweep):
    plan = plan_sweep(
        load_sweep(
            write_sweep(
                "grid",
                """
        levels=[VariantLevel(["train.lr"], [[0.01], [0.003]], ["lr1e-2", "lr3e-3"])],
        seeds=[0, 1],
        overrides={"train.iterations": 10},
        """,
            )
        )
    )
    cores = _two_cores()
    slots = make_slots(cpus_per_run=1, cpus=cores)
    out = io.StringIO()
    outcomes = launch_local(plan, slots, poll_s=0.1, out=out)
    assert [o.state for o in outcomes] == ["completed"] * 4, out.getvalue()

    manifest = json.loads((plan.exp_dir / "sweep.json").read_text())
    spans = []
    for run, record in zip(plan.runs, manifest["runs"], strict=True):
        summary = json.loads((run.run_dir / "summary.json").read_text())
        slot = next(s for s in slots if s.describe() == record["slot"])
        assert summary["affinity"] == list(slot.cpus)  # pinned to its slot's cores
        assert summary["env"]["OMP_NUM_THREADS"] == "1" and summary["env"]["TDRL_SLOT_CPUS"] == str(
            slot.cpus[0]
        )
        assert summary["env"]["CUDA_VISIBLE_DEVICES"] == ""
        assert json.loads((run.run_dir / "variant.json").read_text()) == run.variant
        cfg = json.loads((run.run_dir / "config.json").read_text())
        assert cfg["run"]["seed"] == run.seed and cfg["train"]["lr"] == run.variant["train"]["lr"]
        assert len((run.run_dir / "progress.csv").read_text().splitlines()) == 11
        spans.append((record["started"], record["ended"]))
    # never more runs at once than slots
    for t, _ in spans:
        assert sum(s <= t < e for s, e in spans) <= len(slots)
    if len(slots) == 2:
        assert any(
            a[0] < b[1] and b[0] < a[1] for a in spans for b in spans if a != b
        )  # they did overlap

    tree = (plan.exp_dir / "experiments_tree.txt").read_text()
    assert f"Experiment manager process ID: {os.getpid()}." in tree
    assert "Number of settings (experiments) to run: 2  (4 runs)." in tree
    assert "lr1e-2/\n  run_0\n  run_1\nlr3e-3/\n  run_0\n  run_1" in tree
    assert (
        plan.exp_dir / "num_launched.txt"
    ).read_text() == "Experiments launched so far: 4 out of 4.\n"
    assert "4 completed" in out.getvalue()

    # the sweep's learning curves: one mean curve (with its band over the 2 seeds) per variant
    from tdrl.plot import plot_learning_curves

    written = plot_learning_curves([plan.exp_dir])
    assert written == {plan.exp_dir / "plots" / "eval_return_mean.png": 2}

    # launching again skips the finished runs
    again = launch_local(plan, slots, out=io.StringIO())
    assert [o.state for o in again] == ["skipped"] * 4


@pytest.mark.timeout(240)
def test_a_failing_run_is_recorded_and_the_others_go_on(write_sweep):
    plan = plan_sweep(
        load_sweep(
            write_sweep(
                "failing",
                """
        levels=[VariantLevel(["train.fail_at_iteration"], [[2], [-1]], ["fails", "ok"])],
        overrides={"train.iterations": 6},
        """,
            )
        )
    )
    out = io.StringIO()
    outcomes = launch_local(
        plan, make_slots(cpus_per_run=1, cpus=_two_cores()[:1]), poll_s=0.1, out=out
    )
    failed, ok = outcomes
    assert failed.state == "failed" and failed.returncode == 1 and ok.state == "completed"
    assert failed.log == failed.run.run_dir / "launch.log"
    assert "failing on purpose at iteration 2" in failed.log.read_text()
    text = out.getvalue()
    assert "FAILED fails/run_0" in text and str(failed.log) in text and "failing on purpose" in text
    assert "1 completed, 1 failed" in text
    states = {s.name: s for s in sweep_status(plan.exp_dir)}
    assert states["fails/run_0"].state == "FAILED" and states["fails/run_0"].log == str(failed.log)
    assert states["ok/run_0"].state == "COMPLETED" and states["ok/run_0"].rows == 6
    res = subprocess.run(
        [sys.executable, str(LAUNCH), "status", str(plan.exp_dir), "--results", "--columns", "all"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1  # a run failed
    header = res.stdout.splitlines()[0].split()
    assert header[:5] == ["run", "state", "rows", "Iteration", "CumSteps"] and "loss" in header
    assert (
        "FAILED" in res.stdout
        and str(failed.log) in res.stdout
        and "1 completed, 1 failed" in res.stdout
    )
    assert (plan.exp_dir / "results.csv").read_text().count("\n") == 3


def _launch_in_background(path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(LAUNCH), "local", str(path), "--max-parallel", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_rows(progress: Path, rows: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while not (progress.exists() and len(progress.read_text().splitlines()) > rows):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(240)
def test_stopping_the_launcher_stops_its_runs(write_sweep, tmp_path):
    path = write_sweep("stop", 'overrides={"train.iterations": 200, "train.step_sleep_s": 0.05},')
    manifest = tmp_path / "runs" / "stop" / "sweep.json"
    progress = tmp_path / "runs" / "stop" / "run_0" / "progress.csv"

    first = _launch_in_background(path)
    _wait_rows(progress, 2, first)
    # a second launch of the same sweep while the first runs it is refused: two writers in one run dir
    res = subprocess.run(
        [sys.executable, str(LAUNCH), "local", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "are still active: run_0 (RUNNING)" in res.stderr
    pid = json.loads(manifest.read_text())["runs"][0]["pid"]
    first.send_signal(signal.SIGTERM)  # Ctrl-C / SIGTERM: the launcher stops its runs, then exits
    out, _ = first.communicate(timeout=30)
    assert _gone(pid)
    assert first.returncode == 130 and "Traceback" not in out, out  # one line, with the command that resumes
    assert out.strip().splitlines()[-1].startswith("error: interrupted; the runs it started are stopped"), out
    assert json.loads(manifest.read_text())["runs"][0]["state"] == "interrupted"

    second = _launch_in_background(
        path
    )  # resumes the run; this time the launcher is killed outright
    rows = len(progress.read_text().splitlines())
    _wait_rows(progress, rows + 1, second)
    pid = json.loads(manifest.read_text())["runs"][0]["pid"]
    second.kill()
    second.wait(timeout=10)
    assert _gone(pid)  # the parent-death signal took the run along: no orphan

    res = subprocess.run(
        [sys.executable, str(LAUNCH), "local", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((progress.parent / "summary.json").read_text())
    assert summary["resumed_from"] > rows - 1 > 0
    assert (
        len(progress.read_text().splitlines()) == 201
    )  # every iteration logged once across three launches
