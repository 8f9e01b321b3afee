"""recipes/ddpg.py: in-process smoke runs (serial and parallel collectors, n-step, timeouts as terminal), update
counts from replay_ratio/min_steps_learn, bad input before anything starts, the CLI, and a learning check."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tdrl.config import ConfigError, apply_overrides
from tdrl.launch.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


ddpg = load_recipe(RECIPES / "ddpg.py")

TINY = [
    "collector.total_frames=240", "logger.log_interval_steps=120", "eval.n_envs=2", "eval.max_steps=20",
    "logger.wandb=false", "logger.progress_bar=false", "optim.min_steps_learn=80", "model.hidden_sizes=[16]",
    "optim.batch_size=32", "optim.replay_ratio=32", "replay.size=1000",
]


def tiny(tmp_path: Path, *extra: str):
    return apply_overrides(ddpg.Config(), [*TINY, f"run.root={tmp_path}", *extra])


def test_smoke_counts_updates_and_writes_summary(tmp_path):
    summary = ddpg.main(tiny(tmp_path))
    # one frame per iteration, none before 80 frames, round(32 * 1 / 32) = 1 update per iteration after that
    assert summary["frames"] == 240 and summary["iterations"] == 240
    assert summary["updates"] == 160
    assert math.isfinite(summary["eval/return_mean"])
    (path,) = tmp_path.rglob("summary.json")
    on_disk = json.loads(path.read_text())
    assert on_disk["frames"] == 240 and "wall_s" in on_disk and "eval/return_mean" in on_disk
    (progress,) = tmp_path.rglob("progress.csv")
    header = progress.read_text().splitlines()[0].split(",")
    assert {"loss/actor_mean", "loss/qvalue_mean"} <= set(header), header


def test_smoke_nstep_timeouts_terminal_batched(tmp_path):
    summary = ddpg.main(tiny(tmp_path, "loss.n_step=3", "loss.bootstrap_timelimit=false", "collector.batch_B=2",
                              "collector.batch_T=4", "optim.replay_ratio=4"))
    assert summary["frames"] == 240 and summary["updates"] == 20  # 30 itrs of 8 frames, the first 10 before 80


@pytest.mark.timeout(120)
def test_smoke_parallel_collector(tmp_path):
    summary = ddpg.main(tiny(tmp_path, "collector.kind=parallel", "collector.batch_B=2", "collector.n_workers=2",
                              "collector.batch_T=2", "optim.replay_ratio=16"))
    assert summary["frames"] == 240 and summary["updates"] == 40 * 2  # 60 itrs of 4 frames, 20 before 80


def test_discrete_env_fails_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="env.id='CartPole-v1' has discrete actions"):
        ddpg.main(tiny(tmp_path, "env.id=CartPole-v1"))
    assert not list(tmp_path.rglob("progress.csv"))


def test_unknown_key_names_nearest():
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.batchsize'; did you mean 'optim.batch_size'"):
        apply_overrides(ddpg.Config(), ["optim.batchsize=10"])
    with pytest.raises(ConfigError, match=r"'optim.min_steps_learn'.*int"):
        apply_overrides(ddpg.Config(), ["optim.min_steps_learn=soon"])


def test_cli_help_lists_keys():
    out = subprocess.run([sys.executable, str(RECIPES / "ddpg.py"), "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0
    for key in ("collector.kind", "optim.replay_ratio", "optim.min_steps_learn", "loss.bootstrap_timelimit",
                "run.seed", "run.root", "run.dir"):
        assert key in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_learns_pendulum_fixed_seed(tmp_path):
    """Default config, seed 0: the deterministic-policy evaluation reaches -250 within 30k frames."""
    cfg = apply_overrides(ddpg.Config(), [f"run.root={tmp_path}", "logger.wandb=false", "run.seed=0",
                                         "logger.progress_bar=false", "stop_return=-250"])
    summary = ddpg.main(cfg)
    assert summary["frames"] <= 30_000
    assert summary["eval/return_mean"] >= -250, summary["curve"]


def test_learning_start_before_any_complete_transition_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="optim.min_steps_learn=2 is below the"):
        ddpg.main(tiny(tmp_path, "optim.min_steps_learn=2", "loss.n_step=3"))
    assert not list(tmp_path.rglob("progress.csv"))


def test_pretrain_std_is_refused_not_ignored():
    """ActionNoiseConfig's pretrain_std is wired in TD3 only: DDPG refuses it in a line instead of ignoring it."""
    proc = subprocess.run([sys.executable, str(RECIPES / "ddpg.py"), "exploration.pretrain_std=0.5"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "exploration.pretrain_std is TD3's" in proc.stderr, proc.stderr
