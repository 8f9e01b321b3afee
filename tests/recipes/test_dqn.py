"""recipes/dqn.py: in-process smoke runs (DQN, C51 + PER + n-step, vector epsilon, parallel collector, reward
clipping, Atari with episodic lives), update counts from replay_ratio/min_steps_learn, bad input before anything
starts, the CLI, and a learning check."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdrl.config import ConfigError, apply_overrides
from tdrl.launch.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


dqn = load_recipe(RECIPES / "dqn.py")

TINY = [
    "collector.batch_T=8", "collector.total_frames=512", "logger.log_interval_steps=256", "eval.n_envs=2",
    "eval.max_steps=50", "logger.wandb=false", "logger.progress_bar=false", "optim.min_steps_learn=128",
    "model.hidden_sizes=[16]", "replay.size=1000", "optim.replay_ratio=8",
    "run.torch_threads=1",  # the recipe's 2 threads, on a core the other test worker uses: updates ~10x slower
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


@pytest.mark.slow  # a learning check (~30 s): the slow suite; PPO's stays in the default one
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


class TenPerStep(gym.Env):
    """Pays 10 per step; episodes of 8 steps (return 80): reward clipping would show in a logged return."""

    metadata: dict = {"render_modes": []}
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(4, self.t / 8, np.float32), 10.0, self.t >= 8, False, {}

    def state_dict(self) -> dict:
        return {"t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.t = state["t"]


def test_clip_reward_smoke_keeps_the_logged_returns_raw(tmp_path):
    if "tdrl_test/TenPerStep-v0" not in gym.registry:
        gym.register("tdrl_test/TenPerStep-v0", entry_point=TenPerStep)
    summary = dqn.main(tiny(tmp_path, "env.id=tdrl_test/TenPerStep-v0", "loss.clip_reward=true"))
    assert summary["updates"] == 48
    assert summary["train/return_mean"] == summary["eval/return_mean"] == 80.0


@pytest.mark.parametrize("n_step", [1, 3])
def test_clip_reward_clips_each_step_before_the_n_step_sum(tmp_path, n_step):
    """The DQN loss reads the replay's n-step reward: with clipping it is the discounted sum of the *clipped* step
    rewards (not the clipped sum); the stored rewards (and the collector's TrajInfos) stay raw."""
    from tdrl.envs import EnvFactory
    from tdrl.models import make_q_actor
    from tdrl.objectives.dqn import make_dqn_loss
    from tdrl.replay import TransitionReplayBuffer

    gamma, T = 0.5, 8
    raw = torch.tensor([5.0, -3.0, 0.5, 2.0, -0.25, 7.0, 1.0, -9.0])
    flags = {key: torch.zeros(1, T, 1, dtype=torch.bool) for key in ("done", "terminated", "truncated")}
    time = torch.arange(T, dtype=torch.float32).view(1, T, 1).expand(1, T, 4)  # observation[0] = the step
    batch = TensorDict({"observation": time, "action": torch.zeros(1, T, dtype=torch.long),
                        "next": {"observation": time + 1, "reward": raw.view(1, T, 1), **flags}}, [1, T])
    samples = {}
    for clip in (False, True):
        replay = TransitionReplayBuffer(tmp_path / str(clip), 100, n_step=n_step, gamma=gamma, seed=0,
                                        clip_reward=clip)
        replay.extend(batch)
        samples[clip] = replay.sample(64)
    for clip, source in ((False, raw), (True, raw.clamp(-1, 1))):
        start = samples[clip]["observation"][:, 0].long()
        expected = sum(gamma**i * source[start + i] for i in range(n_step))
        torch.testing.assert_close(samples[clip]["next", "reward"].squeeze(-1), expected)
    q_actor = make_q_actor(EnvFactory("CartPole-v1").specs(), hidden_sizes=[8])
    with torch.no_grad():
        for param in q_actor.parameters():
            param.zero_()  # Q = 0 everywhere: the TD target is the sampled reward
    sample = samples[True]
    make_dqn_loss(q_actor, gamma=gamma)(sample)
    clipped_return = sample["next", "reward"].squeeze(-1)
    assert clipped_return.abs().max() <= sum(gamma**i for i in range(n_step))
    torch.testing.assert_close(sample["td_error"].squeeze(-1), clipped_return.pow(2))


@pytest.mark.timeout(300)
def test_atari_episodic_lives_clipped_smoke(tmp_path):
    """env.episodic_lives reaches the Atari env (Breakout, conv torso), with loss.clip_reward."""
    pytest.importorskip("ale_py", reason="needs ale-py: pip install 'tdrl[atari]'")
    summary = dqn.main(tiny(tmp_path, "env.id=ALE/Breakout-v5", "env.episodic_lives=true", "loss.clip_reward=true",
                            "collector.total_frames=256", "optim.min_steps_learn=192", "optim.batch_size=8",
                            "optim.replay_ratio=1",
                            "eval.n_envs=1", "eval.max_steps=20", "replay.size=300"))
    assert summary["frames"] == 256 and summary["updates"] > 0 and math.isfinite(summary["eval/return_mean"])
