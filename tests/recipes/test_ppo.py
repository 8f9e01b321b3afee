"""recipes/ppo.py: in-process smoke runs (feed-forward, LSTM, continuous, parallel collector, Atari with the CNN
actor-critic), reward clipping, the CLI, config errors before anything starts, NaN stopping the run, resume, and one
learning check that can fail."""

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
from tdrl.log.progress import read_progress_floats
from tdrl.objectives.update import NonFiniteLossError

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


ppo = load_recipe(RECIPES / "ppo.py")

TINY = [
    "collector.batch_B=4", "collector.batch_T=16", "collector.total_frames=256", "logger.log_interval_steps=128",
    "eval.n_envs=2", "eval.max_steps=40", "logger.wandb=false", "logger.progress_bar=false",
    "loss.epochs=2", "loss.minibatches=2",
]


def tiny(tmp_path: Path, *extra: str):
    return apply_overrides(ppo.Config(), [*TINY, f"run.root={tmp_path}", *extra])


def _summary_file(root: Path) -> dict:
    (path,) = root.rglob("summary.json")
    return json.loads(path.read_text())


def test_smoke_feedforward_writes_summary(tmp_path):
    summary = ppo.main(tiny(tmp_path))
    assert summary["frames"] == 256 and summary["iterations"] == 4
    assert summary["updates"] == 4 * 2 * 2  # iterations x epochs x minibatches
    assert math.isfinite(summary["eval/return_mean"])
    on_disk = _summary_file(tmp_path)
    assert on_disk["frames"] == 256 and on_disk["eval/return_mean"] == summary["eval/return_mean"]
    assert "wall_s" in on_disk
    (progress,) = tmp_path.rglob("progress.csv")
    header = progress.read_text().splitlines()[0].split(",")
    assert {"CumSteps", "eval/return_mean", "loss/objective_mean", "loss/critic_mean"} <= set(header)


def test_smoke_lstm_policy(tmp_path):
    summary = ppo.main(tiny(tmp_path, "model.lstm=true", "model.lstm_size=16"))
    assert summary["frames"] == 256 and summary["updates"] == 16


def test_smoke_continuous_with_obs_norm(tmp_path):
    cfg = tiny(tmp_path, "env.id=Pendulum-v1", "model.normalize_observation=true", "model.distribution=normal",
               "loss.normalize_reward=true")
    summary = ppo.main(cfg)
    assert summary["frames"] == 256 and math.isfinite(summary["eval/return_mean"])


def _record_gae(monkeypatch) -> list:
    """Each batch GAE receives, as the recipe hands it over: ``seen`` collects them."""
    from tdrl.objectives import advantage

    seen: list = []

    class RecordingGAE(advantage.GAE):
        def __call__(self, batch):
            seen.append(batch.clone())
            return super().__call__(batch)

    monkeypatch.setattr(advantage, "GAE", RecordingGAE)  # main imports it when it runs
    return seen


def test_clip_reward_clips_what_the_advantages_see(tmp_path, monkeypatch):
    seen = _record_gae(monkeypatch)
    ppo.main(tiny(tmp_path, "env.id=Pendulum-v1", "loss.clip_reward=true"))
    rewards = torch.cat([batch["next", "reward"] for batch in seen])
    assert rewards.min() == -1.0 and rewards.max() <= 0.0  # Pendulum's rewards reach -16


@pytest.mark.timeout(300)
def test_atari_smoke_cnn_actor_critic(tmp_path, monkeypatch):
    """ALE Pong through the recipe (episodic lives, clipped rewards, a small batch): the CNN actor-critic acts on
    uint8 stacks of 4 frames, which reach the update as uint8 too."""
    pytest.importorskip("ale_py", reason="needs ale-py: pip install 'tdrl[atari]'")
    pytest.importorskip("cv2", reason="needs opencv: pip install 'tdrl[atari]'")
    seen = _record_gae(monkeypatch)
    summary = ppo.main(tiny(tmp_path, "env.id=ALE/Pong-v5", "env.episodic_lives=true", "loss.clip_reward=true",
                            "collector.batch_B=2", "collector.batch_T=64", "eval.n_envs=1", "eval.max_steps=30"))
    assert summary["frames"] == 256 and summary["updates"] == 2 * 2 * 2 and math.isfinite(summary["eval/return_mean"])
    observation = seen[0]["observation"]
    assert observation.dtype == torch.uint8 and observation.shape == (2, 64, 4, 84, 84)


@pytest.mark.timeout(120)
def test_smoke_parallel_collector(tmp_path):
    summary = ppo.main(tiny(tmp_path, "collector.kind=parallel", "collector.n_workers=2"))
    assert summary["frames"] == 256


def test_wrong_distribution_for_action_space_fails_before_collectors(tmp_path):
    with pytest.raises(ValueError, match="categorical.*continuous"):
        ppo.main(tiny(tmp_path, "env.id=Pendulum-v1", "model.distribution=categorical"))
    assert not list(tmp_path.rglob("progress.csv"))  # nothing was started


def test_unknown_key_names_nearest():
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.lrr'; did you mean 'optim.lr'"):
        apply_overrides(ppo.Config(), ["optim.lrr=1e-3"])
    with pytest.raises(ConfigError, match=r"'loss.epochs'.*int"):
        apply_overrides(ppo.Config(), ["loss.epochs=many"])
    with pytest.raises(ConfigError, match=r"loss.reward_scale=0.1 has no effect with loss.normalize_reward=true"):
        apply_overrides(ppo.Config(), ["loss.normalize_reward=true", "loss.reward_scale=0.1"])


def test_nan_loss_stops_run_without_nan_parameters(tmp_path, monkeypatch):
    """Every update's loss is NaN: each is skipped on the device and the first log row (2 iterations of 2 epochs x
    2 minibatches) raises, naming update 0; no checkpoint holds a NaN parameter."""
    from tdrl.objectives import policy_gradient

    real_make_loss = policy_gradient.make_ppo_loss

    def nan_loss(*args, **kwargs):
        loss = real_make_loss(*args, **kwargs)
        forward = loss.forward
        loss.forward = lambda td: forward(td).apply(lambda v: v * float("nan"))
        return loss

    monkeypatch.setattr(policy_gradient, "make_ppo_loss", nan_loss)  # main imports it when it runs
    cfg = tiny(tmp_path, "checkpoint.snapshot_mode=all")
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss_\w+ = nan at gradient update 0; 8 update") as err:
        ppo.main(cfg)
    assert err.value.key.startswith("loss_") and err.value.skipped == 8
    assert not list(tmp_path.rglob("summary.json"))  # the run did not finish
    for state_file in tmp_path.rglob("state.pt"):  # no checkpoint holds a NaN parameter
        state = torch.load(state_file, weights_only=False)["state"]["model"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_resume_from_run_dir_continues(tmp_path):
    run_dir = tmp_path / "run"
    first = ppo.main(tiny(tmp_path, f"run.dir={run_dir}", "collector.total_frames=128"))
    assert first["frames"] == 128
    # relaunch on the same run directory with a larger budget: resumes at the checkpoint, does not start over
    second = ppo.main(tiny(tmp_path, f"run.dir={run_dir}", "collector.total_frames=256", "run.force=true"))
    assert second["frames"] == 256 and second["iterations"] == 4


def test_cli_help_and_tiny_run(tmp_path):
    script = str(RECIPES / "ppo.py")
    out = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for key in ("collector.kind", "loss.clip_epsilon", "model.lstm", "run.seed", "run.root", "eval.n_envs",
                "env.episodic_lives", "loss.clip_reward"):
        assert key in out.stdout
    bad = subprocess.run([sys.executable, script, "loss.clip_epsilonn=0.1"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "did you mean 'loss.clip_epsilon'" in bad.stderr
    run = subprocess.run([sys.executable, script, *TINY, f"run.root={tmp_path}"], capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "WANDB_MODE": "disabled"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert _summary_file(tmp_path)["frames"] == 256


@pytest.mark.timeout(300)
def test_learns_cartpole_fixed_seed(tmp_path):
    """Default config, seed 0: the greedy policy's evaluation return reaches 475 (gymnasium's threshold)."""
    cfg = apply_overrides(ppo.Config(), [f"run.root={tmp_path}", "logger.wandb=false", "run.seed=0",
                                         "logger.progress_bar=false"])
    summary = ppo.main(cfg)
    assert summary["frames"] <= 105_000
    assert summary["eval/return_mean"] >= 475, summary["curve"]


@pytest.mark.timeout(300)
def test_conv_actor_critic_learns_minatar_breakout_fixed_seed(tmp_path):
    """The CNN actor-critic on frames (MinAtar's torso, CleanRL's Atari PPO terms at a higher learning rate), seed 0:
    40k frames lift the return from a near-random policy's ~0.5 (its first 20k frames at lr 2.5e-4) to ~3."""
    pytest.importorskip("minatar", reason="needs minatar: pip install 'tdrl[minatar]'")
    cfg = apply_overrides(ppo.Config(), [
        f"run.root={tmp_path}", "logger.wandb=false", "logger.progress_bar=false", "run.seed=0",
        "env.id=MinAtar/Breakout-v1", "collector.batch_B=8", "collector.batch_T=32", "collector.total_frames=40960",
        "loss.epochs=4", "loss.minibatches=2", "optim.lr=1e-3", "loss.clip_epsilon=0.1", "loss.entropy_coeff=0.01",
        "loss.value_loss_coeff=0.5", "loss.gamma=0.99", "loss.gae_lambda=0.95", "logger.log_interval_steps=10240",
        "eval.n_envs=8"])
    summary = ppo.main(cfg)
    (progress,) = tmp_path.rglob("progress.csv")
    train = read_progress_floats(progress)["train/return_mean"]
    assert train[-1] >= 2.0 and summary["eval/return_mean"] >= 2.0, (summary["curve"], train)  # measured 2.99, 3.75
