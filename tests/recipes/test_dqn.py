"""recipes/dqn.py: in-process smoke runs (DQN, C51 + PER + n-step, vector epsilon, parallel collector), update
counts from replay_ratio/min_steps_learn, bad input before anything starts, the CLI, and a learning check."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tdrl.config import ConfigError, apply_overrides
from tdrl.launch.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


dqn = load_recipe(RECIPES / "dqn.py")

TINY = [
    "collector.batch_T=8", "collector.total_frames=512", "logger.log_interval_steps=256", "eval.n_envs=2",
    "eval.max_steps=50", "logger.wandb=false", "logger.progress_bar=false", "optim.min_steps_learn=128",
    "model.hidden_sizes=[16]", "replay.size=1000", "optim.replay_ratio=8",
]


def tiny(tmp_path: Path, *extra: str):
    return apply_overrides(dqn.Config(), [*TINY, f"run.root={tmp_path}", *extra])


def test_smoke_double_dueling_counts_updates(tmp_path):
    summary = dqn.main(tiny(tmp_path))
    # 64 iterations of 8 frames; none before 128 frames (16 iterations); round(8 * 8 / 64) = 1 update each
    assert summary["frames"] == 512 and summary["iterations"] == 64
    assert summary["updates"] == 48
    assert math.isfinite(summary["eval/return_mean"])
    (path,) = tmp_path.rglob("summary.json")
    on_disk = json.loads(path.read_text())
    assert on_disk["frames"] == 512 and "wall_s" in on_disk and "eval/return_mean" in on_disk
    (progress,) = tmp_path.rglob("progress.csv")
    assert "loss/q_mean" in progress.read_text().splitlines()[0].split(",")


def test_smoke_rainbow_minus_noisy(tmp_path):
    """C51 + dueling + double + 3-step returns + prioritized replay, replay ratio 16 (2 updates per iteration)."""
    summary = dqn.main(tiny(tmp_path, "model.categorical=true", "model.n_atoms=11", "replay.prioritized=true",
                            "loss.n_step=3", "optim.replay_ratio=16"))
    assert summary["updates"] == 48 * 2 and math.isfinite(summary["eval/return_mean"])


def test_smoke_vector_epsilon_mse_no_dueling(tmp_path):
    summary = dqn.main(tiny(tmp_path, "collector.batch_B=4", "collector.batch_T=2", "exploration.eps_final_min=0.001",
                            "model.dueling=false", "loss.loss_function=mse", "loss.double=false"))
    assert summary["frames"] == 512 and summary["updates"] == 48


@pytest.mark.timeout(120)
def test_smoke_parallel_collector(tmp_path):
    summary = dqn.main(tiny(tmp_path, "collector.kind=parallel", "collector.batch_B=2", "collector.batch_T=4",
                            "collector.n_workers=2"))
    assert summary["frames"] == 512 and summary["updates"] == 48


def test_continuous_env_fails_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="env.id='Pendulum-v1' has continuous actions"):
        dqn.main(tiny(tmp_path, "env.id=Pendulum-v1"))
    assert not list(tmp_path.rglob("progress.csv"))


def test_categorical_without_double_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="loss.double"):
        dqn.main(tiny(tmp_path, "model.categorical=true", "loss.double=false"))
    assert not list(tmp_path.rglob("progress.csv"))


def test_unknown_key_names_nearest():
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.target_update_intervl'; did you mean "
                                          r"'optim.target_update_interval'"):
        apply_overrides(dqn.Config(), ["optim.target_update_intervl=10"])
    with pytest.raises(ConfigError, match=r"'replay.prioritized'.*bool"):
        apply_overrides(dqn.Config(), ["replay.prioritized=maybe"])


def test_cli_help_lists_keys_and_bad_key_exits_2():
    script = str(RECIPES / "dqn.py")
    out = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for key in ("collector.kind", "model.categorical", "exploration.eps_final_min", "replay.prioritized",
                "optim.target_update_interval", "run.seed", "run.root"):
        assert key in out.stdout
    bad = subprocess.run([sys.executable, script, "loss.n_stp=3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "did you mean 'loss.n_step'" in bad.stderr


@pytest.mark.timeout(900)
def test_learns_cartpole_fixed_seed(tmp_path):
    """Default config (double + dueling), seed 0: the greedy evaluation reaches 475 within 100k frames."""
    cfg = apply_overrides(dqn.Config(), [f"run.root={tmp_path}", "logger.wandb=false", "run.seed=0",
                                         "logger.progress_bar=false", "stop_return=475"])
    summary = dqn.main(cfg)
    assert summary["frames"] <= 100_000
    assert summary["eval/return_mean"] >= 475, summary["curve"]


def test_learning_start_before_any_complete_transition_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="optim.min_steps_learn=2 is below the"):
        dqn.main(tiny(tmp_path, "optim.min_steps_learn=2", "loss.n_step=3"))
    assert not list(tmp_path.rglob("progress.csv"))


def test_resume_restores_epsilon_and_counters(tmp_path):
    run_dir = tmp_path / "run"
    cfg = ["exploration.eps_steps=300", "collector.total_frames=256"]
    first = dqn.main(tiny(tmp_path, f"run.dir={run_dir}", *cfg))
    assert first["frames"] == 256 and first["updates"] == 16
    (state_file,) = run_dir.rglob("state.pt")  # epsilon is checkpointed: 128 frames into its 128 -> 300 ramp
    eps = torch.load(state_file, weights_only=False)["state"]["exploration"]["eps"]
    assert float(eps) == pytest.approx(1.0 + (256 - 128) / (300 - 128) * (0.04 - 1.0))
    second = dqn.main(tiny(tmp_path, f"run.dir={run_dir}", *cfg[:1], "collector.total_frames=512", "run.force=true"))
    assert second["frames"] == 512 and second["updates"] == 48
