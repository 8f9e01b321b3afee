"""recipes/mappo.py: MAPPO and IPPO smoke runs on mpe2's simple_spread (grouped batches through TorchRL's
multi-agent losses), and bad input before anything starts."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tdrl.config import apply_overrides
from tdrl.launch.recipe import load_recipe

pytest.importorskip("mpe2")

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
mappo = load_recipe(RECIPES / "mappo.py")

TINY = ["collector.batch_B=2", "collector.batch_T=25", "collector.total_frames=200", "logger.log_interval_steps=100",
        "eval.n_envs=2", "logger.wandb=false", "logger.progress_bar=false", "loss.epochs=2", "loss.minibatches=2",
        "model.hidden_sizes=[16]"]


@pytest.mark.parametrize("extra", [["loss.algorithm=mappo"], ["loss.algorithm=ippo", "env.group_map=per_agent"]],
                         ids=["mappo", "ippo-per-agent"])
def test_smoke(tmp_path, extra):
    summary = mappo.main(apply_overrides(mappo.Config(), [*TINY, f"run.root={tmp_path}", *extra]))
    assert summary["frames"] == 200 and summary["updates"] == 4 * 2 * 2  # 4 batches, 2 epochs of 2 minibatches
    assert math.isfinite(summary["eval/return_mean"])
    (progress,) = tmp_path.rglob("progress.csv")
    assert "loss/objective_mean" in progress.read_text().splitlines()[0].split(",")


def test_unknown_env_exits_2_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(RECIPES / "mappo.py"), "env.id=mpe2/simple_sprd_v3",
                          f"run.root={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "unknown environment id 'mpe2/simple_sprd_v3'; mpe2 has" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
