"""recipes/impala.py: in-process smoke runs (feed-forward, LSTM, continuous) with trainer.kind=sync, the policy lag
logged from version-tagged unrolls (the distributed trainer's contract), config errors, the CLI, and (slow) CartPole
solved. V-trace itself is tested in tests/objectives/test_advantage.py."""

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
from tdrl.log.progress import read_progress_floats

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


impala = load_recipe(RECIPES / "impala.py")

TINY = [
    "collector.batch_B=4", "collector.batch_T=8", "collector.total_frames=256", "logger.log_interval_steps=128",
    "eval.n_envs=2", "eval.max_steps=40", "logger.wandb=false", "logger.progress_bar=false",
]


def tiny(tmp_path: Path, *extra: str):
    return apply_overrides(impala.Config(), [*TINY, f"run.root={tmp_path}", *extra])


@pytest.mark.timeout(300)
def test_atari_smoke_cnn_actor_critic(tmp_path):
    """ALE Breakout through the recipe with episodic lives and clipped rewards: the CNN actor-critic."""
    pytest.importorskip("ale_py", reason="needs ale-py: pip install 'tdrl[atari]'")
    summary = impala.main(tiny(tmp_path, "env.id=ALE/Breakout-v5", "env.episodic_lives=true", "loss.clip_reward=true",
                             "collector.batch_B=2", "collector.total_frames=128", "logger.log_interval_steps=64",
                             "eval.n_envs=1", "eval.max_steps=30"))
    assert summary["frames"] == 128 and summary["updates"] == 8 and math.isfinite(summary["eval/return_mean"])


def test_smoke_sync_writes_its_run_dir(tmp_path):
    summary = impala.main(tiny(tmp_path))
    assert summary["frames"] == 256 and summary["iterations"] == 8 and summary["updates"] == 8
    assert math.isfinite(summary["eval/return_mean"])
    (run_dir,) = {p.parent for p in tmp_path.rglob("summary.json")}
    assert json.loads((run_dir / "summary.json").read_text())["frames"] == 256
    assert json.loads((run_dir / "config.json").read_text())["loss"]["rho_bar"] == 1.0
    assert list((run_dir / "checkpoints").iterdir())
    last = {key: values[-1] for key, values in read_progress_floats(run_dir / "progress.csv").items()}
    for column in ("loss/objective_mean", "loss/critic_mean", "loss/entropy_mean", "train/grad_norm_mean"):
        assert math.isfinite(last[column]), column
    # sync collects with the learner's weights: no importance correction, no version tags
    assert last["train/rho_mean"] == pytest.approx(1.0, abs=1e-5)
    assert "train/policy_lag_mean" not in last


def test_smoke_lstm_adam(tmp_path):
    summary = impala.main(tiny(tmp_path, "model.lstm=true", "model.lstm_size=16", "optim.name=adam"))
    assert summary["updates"] == 8 and math.isfinite(summary["eval/return_mean"])


def test_smoke_continuous(tmp_path):
    summary = impala.main(tiny(tmp_path, "env.id=Pendulum-v1", "model.normalize_observation=true"))
    assert summary["frames"] == 256 and math.isfinite(summary["eval/return_mean"])


def test_policy_lag_from_version_tagged_unrolls(tmp_path, monkeypatch):
    """A distributed trainer yields unrolls tagged ("collector", "policy_version") and exposes policy_version: the
    recipe logs the learner's version minus the tags (here a sync trainer dressed up as one)."""
    from tdrl import wiring
    from tdrl.train import SyncTrainer

    class TaggingTrainer(SyncTrainer):
        policy_version = 7

        def __iter__(self):
            for batch in super().__iter__():
                tags = torch.full(batch.shape, 5, dtype=torch.int64)
                tags[0] = 3  # one actor's unroll is older
                batch.set(("collector", "policy_version"), tags)
                yield batch

    real_make_trainer = wiring.make_trainer

    def make_trainer(*args, **kwargs):
        trainer = real_make_trainer(*args, **kwargs)
        trainer.__class__ = TaggingTrainer
        return trainer

    monkeypatch.setattr(wiring, "make_trainer", make_trainer)  # main imports it when it runs
    impala.main(tiny(tmp_path))
    (progress,) = tmp_path.rglob("progress.csv")
    last = {key: values[-1] for key, values in read_progress_floats(progress).items()}
    assert last["train/policy_lag_mean"] == pytest.approx(2.5)  # 4 unrolls: lags 4, 2, 2, 2
    assert last["train/policy_lag_max_max"] == 4


def test_config_errors_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"did you mean 'loss.rho_bar'"):
        apply_overrides(impala.Config(), ["loss.rho_barr=2"])
    with pytest.raises(ConfigError, match=r"'loss.c_bar'.*must be > 0"):
        apply_overrides(impala.Config(), ["loss.c_bar=0"])
    with pytest.raises(ConfigError, match=r"'optim.name'.*not one of"):
        apply_overrides(impala.Config(), ["optim.name=sgd"])
    with pytest.raises(ConfigError, match=r"'trainer.kind'.*not one of \['sync', 'ray'\]"):  # --help lists these
        apply_overrides(impala.Config(), ["trainer.kind=async"])
    with pytest.raises(ValueError, match="categorical.*continuous"):
        impala.main(tiny(tmp_path, "env.id=Pendulum-v1", "model.distribution=categorical"))
    assert not list(tmp_path.rglob("progress.csv"))


def test_cli_help():
    out = subprocess.run([sys.executable, str(RECIPES / "impala.py"), "--help"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "WANDB_MODE": "disabled"})
    assert out.returncode == 0
    for key in ("loss.rho_bar", "loss.c_bar", "optim.name", "model.lstm", "trainer.kind", "run.seed"):
        assert key in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_learns_cartpole_sync(tmp_path):
    cfg = apply_overrides(impala.Config(), [f"run.root={tmp_path}", "logger.wandb=false", "logger.progress_bar=false",
                                            "stop_return=475"])
    summary = impala.main(cfg)
    assert summary["eval/return_mean"] >= 475, summary["curve"]
