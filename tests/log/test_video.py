"""``eval.video=true``: real recipe runs write one mp4 per evaluation (env 0's greedy episode: its reset frame and
one frame per step) into the run directory; MuJoCo renders headless through EGL (tests/conftest.py sets it)."""

from __future__ import annotations

import csv
from pathlib import Path

import imageio.v3 as iio
import pytest

from tdrl.config import apply_overrides
from tdrl.launch.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QUIET = ["logger.wandb=false", "logger.progress_bar=false", "eval.video=true"]


def run_recipe(name: str, tmp_path: Path, *overrides: str) -> Path:
    recipe = load_recipe(RECIPES / name)
    recipe.main(apply_overrides(recipe.Config(), [*QUIET, *overrides, f"run.dir={tmp_path / 'run'}"]))
    return tmp_path / "run"


def videos_and_rows(run_dir: Path) -> list[tuple[int, dict[str, str]]]:
    """(frames in the mp4, progress row) per evaluation; the file name carries the row's CumSteps."""
    rows = list(csv.DictReader((run_dir / "progress.csv").open()))
    videos = sorted((run_dir / "videos").glob("video_*.mp4"))
    assert [int(v.stem.split("_")[1]) for v in videos] == [int(r["CumSteps"]) for r in rows]
    return [(iio.imread(v, plugin="FFMPEG").shape[0], row) for v, row in zip(videos, rows, strict=True)]


def test_cartpole_ppo_one_video_per_evaluation_of_the_episode_length(tmp_path):
    run_dir = run_recipe("ppo.py", tmp_path, "collector.batch_B=4", "collector.batch_T=16",
                         "collector.total_frames=192", "logger.log_interval_steps=64", "eval.n_envs=1",
                         "eval.max_steps=60", "loss.epochs=1")
    evaluations = videos_and_rows(run_dir)
    assert len(evaluations) == 4  # iteration 0 and three log rows
    for frames, row in evaluations:  # one evaluated episode: its length is in the row
        assert frames == int(float(row["eval/length_mean"])) + 1


def test_halfcheetah_sac_videos_of_whole_episodes(tmp_path):
    pytest.importorskip("mujoco")
    run_dir = run_recipe("sac.py", tmp_path, "env.id=HalfCheetah-v5", "collector.total_frames=40",
                         "logger.log_interval_steps=20", "eval.n_envs=2", "eval.max_steps=12",
                         "optim.min_steps_learn=10", "model.hidden_sizes=[16]", "optim.batch_size=8",
                         "optim.replay_ratio=8", "replay.size=100")
    evaluations = videos_and_rows(run_dir)
    assert len(evaluations) == 3
    assert all(frames == 12 + 1 for frames, _ in evaluations)  # HalfCheetah never terminates: max_steps each
    first = iio.imread(sorted((run_dir / "videos").glob("*.mp4"))[0], plugin="FFMPEG")
    assert first.std() > 5  # a rendered scene, not a blank frame
