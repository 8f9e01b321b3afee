"""recipes/mappo.py on VMAS (env.id=vmas/balance, collector.kind=batched_env): a tiny run end to end with its
evaluation, and the one-line exit of a VMAS id with a kind that cannot step it."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tdrl.config import apply_overrides
from tdrl.launch.recipe import load_recipe

pytest.importorskip("vmas")

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
mappo = load_recipe(RECIPES / "mappo.py")

TINY = ["env.id=vmas/balance", "collector.kind=batched_env", "collector.batch_B=4", "collector.batch_T=50",
        "collector.total_frames=2000", "logger.log_interval_steps=1000", "eval.n_envs=2", "eval.max_steps=20",
        "logger.wandb=false", "logger.progress_bar=false", "loss.epochs=1", "model.hidden_sizes=[16]"]


@pytest.mark.timeout(120)
def test_smoke_on_balance(tmp_path):
    summary = mappo.main(apply_overrides(mappo.Config(), [*TINY, f"run.root={tmp_path}"]))
    assert summary["frames"] == 2000 and summary["updates"] == 10  # 10 batches of 4 x 50, one epoch each
    assert math.isfinite(summary["eval/return_mean"])
    (progress,) = tmp_path.rglob("progress.csv")
    columns = set(progress.read_text().splitlines()[0].split(","))
    assert {"train/return_mean", "train/agent/return_mean", "eval/agent/return_mean"} <= columns


def test_vmas_id_with_a_worker_kind_exits_2_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(RECIPES / "mappo.py"), "env.id=vmas/balance", "collector.kind=parallel",
                          f"run.root={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == ("error: environment 'vmas/balance' is a batched torch env (num_envs envs in one "
                                  "object): it steps with collector.kind=batched_env, not parallel")
    assert not list(tmp_path.iterdir())
