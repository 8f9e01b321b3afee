"""recipes/a2c.py: in-process smoke runs (feed-forward, LSTM, continuous), one gradient step per iteration,
config errors, NaN stopping the run, and the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tdrl.config import ConfigError, apply_overrides
from tdrl.launch.recipe import load_recipe
from tdrl.objectives.update import NonFiniteLossError

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


a2c = load_recipe(RECIPES / "a2c.py")

TINY = [
    "collector.batch_B=4", "collector.batch_T=8", "collector.total_frames=256", "logger.log_interval_steps=128",
    "eval.n_envs=2", "eval.max_steps=40", "logger.wandb=false", "logger.progress_bar=false",
]


def tiny(tmp_path: Path, *extra: str):
    return apply_overrides(a2c.Config(), [*TINY, f"run.root={tmp_path}", *extra])


@pytest.mark.timeout(300)
def test_atari_smoke_cnn_actor_critic(tmp_path):
    """ALE Breakout through the recipe with episodic lives and clipped rewards: the CNN actor-critic."""
    pytest.importorskip("ale_py", reason="needs ale-py: pip install 'tdrl[atari]'")
    summary = a2c.main(tiny(tmp_path, "env.id=ALE/Breakout-v5", "env.episodic_lives=true", "loss.clip_reward=true",
                             "collector.batch_B=2", "collector.total_frames=128", "logger.log_interval_steps=64",
                             "eval.n_envs=1", "eval.max_steps=30"))
    assert summary["frames"] == 128 and summary["updates"] == 8 and math.isfinite(summary["eval/return_mean"])


def test_smoke_one_update_per_iteration(tmp_path):
    summary = a2c.main(tiny(tmp_path))
    assert summary["frames"] == 256 and summary["iterations"] == 8 and summary["updates"] == 8
    assert math.isfinite(summary["eval/return_mean"])
    (path,) = tmp_path.rglob("summary.json")
    assert json.loads(path.read_text())["frames"] == 256


def test_smoke_lstm_adam(tmp_path):
    summary = a2c.main(tiny(tmp_path, "model.lstm=true", "model.lstm_size=16", "optim.name=adam"))
    assert summary["updates"] == 8


def test_smoke_continuous(tmp_path):
    summary = a2c.main(tiny(tmp_path, "env.id=Pendulum-v1", "model.normalize_observation=true"))
    assert summary["frames"] == 256 and math.isfinite(summary["eval/return_mean"])


def test_config_errors_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"did you mean 'optim.name'"):
        apply_overrides(a2c.Config(), ["optim.nmae=adam"])
    with pytest.raises(ConfigError, match=r"'optim.name'.*not one of"):
        apply_overrides(a2c.Config(), ["optim.name=sgd"])
    with pytest.raises(ValueError, match="categorical.*continuous"):
        a2c.main(tiny(tmp_path, "env.id=Pendulum-v1", "model.distribution=categorical"))
    assert not list(tmp_path.rglob("progress.csv"))


def test_nan_loss_stops_run_without_nan_parameters(tmp_path, monkeypatch):
    from tdrl.objectives import policy_gradient

    real_make_loss = policy_gradient.make_a2c_loss

    def nan_at_third_update(*args, **kwargs):
        """Fault injection: the loss's critic term turns NaN at its third call."""
        loss = real_make_loss(*args, **kwargs)
        forward, calls = loss.forward, []

        def faulty(td):
            out = forward(td)
            calls.append(1)
            if len(calls) == 3:
                out["loss_critic"] = out["loss_critic"] * float("nan")
            return out

        loss.forward = faulty
        return loss

    monkeypatch.setattr(policy_gradient, "make_a2c_loss", nan_at_third_update)  # main imports it when it runs
    cfg = tiny(tmp_path, "checkpoint.snapshot_mode=all", "checkpoint.interval_steps=32")
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss_critic = nan at gradient update 2") as err:
        a2c.main(cfg)
    assert err.value.key == "loss_critic" and err.value.update == 2
    assert not list(tmp_path.rglob("summary.json"))
    checkpoints = list(tmp_path.rglob("state.pt"))
    assert checkpoints  # the two good iterations were checkpointed, and none holds a NaN parameter
    for state_file in checkpoints:
        state = torch.load(state_file, weights_only=False)["state"]["model"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_cli_help(tmp_path):
    out = subprocess.run([sys.executable, str(RECIPES / "a2c.py"), "--help"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "WANDB_MODE": "disabled"})
    assert out.returncode == 0
    for key in ("collector.kind", "loss.gae_lambda", "optim.name", "model.lstm", "run.seed", "run.dir"):
        assert key in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_learns_cartpole_fixed_seed(tmp_path):
    cfg = apply_overrides(a2c.Config(), [f"run.root={tmp_path}", "logger.wandb=false", "logger.progress_bar=false",
                                         "logger.log_interval_steps=50000"])
    summary = a2c.main(cfg)
    assert summary["eval/return_mean"] >= 475, summary["curve"]
