"""recipes/r2d1.py: in-process smoke runs with the sync and the async trainer, bad input before anything starts,
and the learning check on CartPole without velocities."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tdrl.config import ConfigError, apply_overrides
from tdrl.launch.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

r2d1 = load_recipe(RECIPES / "r2d1.py")

TINY = [
    "collector.batch_B=2", "collector.batch_T=10", "collector.total_frames=800", "logger.log_interval_steps=400",
    "eval.n_envs=2", "eval.max_steps=50", "logger.wandb=false", "logger.progress_bar=false",
    "optim.min_steps_learn=200", "model.hidden_sizes=[16]", "model.lstm_size=16", "model.head_sizes=[16]",
    "replay.size=2000", "replay.warmup_T=5", "replay.batch_T=10", "loss.n_step=3", "optim.batch_B=4",
    "optim.replay_ratio=6",
]


def tiny(tmp_path: Path, *extra: str):
    return apply_overrides(r2d1.Config(), [*TINY, f"run.root={tmp_path}", *extra])


def test_smoke_sync_counts_updates(tmp_path):
    summary = r2d1.main(tiny(tmp_path))
    # 40 iterations of 20 frames, none before 200 frames (10 iterations); the replay ratio counts every replayed
    # step: round(6 * 20 / (4 sequences * 18 steps)) = 2 updates per iteration
    assert summary["frames"] == 800 and summary["iterations"] == 40
    assert summary["updates"] == 30 * 2
    assert math.isfinite(summary["eval/return_mean"])
    (progress,) = tmp_path.rglob("progress.csv")
    assert "loss/q_mean" in progress.read_text().splitlines()[0].split(",")


def test_smoke_async_uniform_replay(tmp_path):
    summary = r2d1.main(tiny(tmp_path, "trainer.kind=async", "replay.prioritized=false"))
    assert summary["frames"] >= 800 and summary["updates"] > 0 and math.isfinite(summary["eval/return_mean"])


def test_smoke_parallel_collector_images(tmp_path):
    pytest.importorskip("minatar", reason="needs minatar: pip install 'tdrl[minatar]'")
    summary = r2d1.main(tiny(tmp_path, "env.id=MinAtar/Breakout-v1", "collector.kind=parallel",
                             "collector.n_workers=2"))
    assert summary["frames"] == 800 and summary["updates"] > 0
    (path,) = tmp_path.rglob("summary.json")
    assert json.loads(path.read_text())["frames"] == 800


def test_bad_input_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="must exceed loss.n_step"):
        r2d1.main(tiny(tmp_path, "collector.batch_T=3"))
    with pytest.raises(ConfigError, match="min_steps_learn=50 is below the 76 frames"):  # 2 x (18 + 10 x 2)
        r2d1.main(tiny(tmp_path, "optim.min_steps_learn=50"))
    with pytest.raises(ConfigError, match="continuous actions"):
        r2d1.main(tiny(tmp_path, "env.id=Pendulum-v1"))
    assert not list(tmp_path.rglob("progress.csv"))


@pytest.mark.slow
def test_learns_cartpole_without_velocities(tmp_path):
    summary = r2d1.main(apply_overrides(r2d1.Config(), [f"run.root={tmp_path}", "logger.wandb=false",
                                                        "logger.progress_bar=false", "stop_return=475"]))
    assert summary["eval/return_mean"] >= 475
