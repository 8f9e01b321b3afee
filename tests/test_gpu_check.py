"""The prepared GPU check (benchmarks/gpu_check.py) runs its every step on the CPU (``--dry-run``), so the script a
lent GPU machine runs once, with no time to debug, has run before: versions, the CUDA-marked tests (skipped here),
every recipe on the device, the update-rate table from real recipe runs and the Atari collector rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_writes_its_page(tmp_path):
    pytest.importorskip("ale_py", reason="the Atari rows need ale-py ([atari] extra)")
    page = tmp_path / "gpu.md"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--markdown",
                           str(page)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = page.read_text()
    for heading in ("## versions", "## tests", "## recipes", "## updates", "## atari", "Steps failed: none"):
        assert heading in text, heading
    for recipe in ("ppo", "a2c", "impala", "dqn", "ddpg", "td3", "sac", "r2d1"):
        assert f"| {recipe} | ok |" in text
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith(("| DQN, ", "| SAC, ", "| R2D1, "))]
    rates, phases = [r for r in rows if len(r) == 7], [r for r in rows if len(r) == 11]
    # the CPU's loop rows of the three recipes and the learner rows of DQN and SAC, each timed, and their phases
    assert sorted((r[0].split(",")[0].strip(), r[1].strip()) for r in rates) == [
        ("DQN", "learner"), ("DQN", "loop"), ("R2D1", "loop"), ("SAC", "learner"), ("SAC", "loop")], rows
    assert all(float(r[4].replace(",", "")) > 0 for r in rates)
    assert len(phases) == 5 and all(float(r[6].replace(",", "")) > 0 for r in phases)  # learn: microseconds/update
    assert "| tdrl action server (" in text and "| tdrl alternating (" in text


def test_gpu_check_refuses_to_run_without_a_gpu_unless_dry():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode == 0:
        pytest.skip("this machine has CUDA")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: no CUDA device here; use --dry-run to run the steps on the CPU"]
