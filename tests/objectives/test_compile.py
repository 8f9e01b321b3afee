"""The recipes' opt-in ``optim.compile`` switch: PPO with its loss under torch.compile on CPU trains like the eager
loss (same seed, same data, same logged losses)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from tdrl.config import apply_overrides
from tdrl.launch.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
TINY = ["collector.batch_B=2", "collector.batch_T=16", "collector.total_frames=96", "logger.log_interval_steps=32",
        "eval.n_envs=0", "logger.wandb=false", "logger.progress_bar=false", "checkpoint.snapshot_mode=none",
        "loss.epochs=2", "loss.minibatches=2"]
KEYS = ("loss/objective_mean", "loss/critic_mean", "train/grad_norm_mean")


@pytest.mark.slow  # compiling the loss takes 10-30 s on a shared 2-core CPU
def test_compiled_ppo_loss_trains_like_the_eager_one(tmp_path):
    ppo = load_recipe(ROOT / "recipes" / "ppo.py")
    logged = {}
    for compiled in (False, True):
        root = tmp_path / str(compiled)
        summary = ppo.main(apply_overrides(ppo.Config(), [*TINY, f"run.root={root}", f"optim.compile={compiled}"]))
        assert summary["updates"] == 3 * 2 * 2
        (progress,) = root.rglob("progress.csv")
        rows = list(csv.DictReader(progress.open()))
        logged[compiled] = [[float(row[k]) for k in KEYS if row.get(k)] for row in rows]
    assert len(logged[True]) == len(logged[False]) >= 3 and all(logged[False])
    for eager_row, compiled_row in zip(logged[False], logged[True], strict=True):
        assert all(math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-5) for a, b in zip(eager_row, compiled_row, strict=True))
