"""Atari with rlpyt's options: the extra installs what the preprocessing needs, episodic lives, horizon, MinAtar."""

from __future__ import annotations

import pickle
from importlib import metadata
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import tomllib

from tdrl.envs import EnvFactory, capture_problem, make_env
from tdrl.envs.atari import EpisodicLives

pytest.importorskip("ale_py", reason="needs ale-py: pip install 'tdrl[atari]'")
pytest.importorskip("cv2", reason="needs opencv: pip install 'tdrl[atari]'")

ROOT = Path(__file__).resolve().parents[2]


def _layers(env):
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def test_atari_extra_installs_what_the_preprocessing_imports():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["atari"]
    names = {req.split(">")[0].split("=")[0].split("[")[0].strip().lower() for req in extra}
    cv2_dists = {d.lower() for d in metadata.packages_distributions()["cv2"]}  # the installed wheel providing cv2
    assert names & cv2_dists, f"the atari extra {extra} installs none of {cv2_dists} (gymnasium's AtariPreprocessing)"
    assert "ale-py" in names


def test_atari_env_observations_and_options():
    env = make_env("ALE/Pong-v5", seed=0)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    # sticky actions by gymnasium's StickyAction right above the emulator (ALE's own cannot be checkpointed)
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    sticky = [layer for layer in _layers(env) if isinstance(layer, gym.wrappers.StickyAction)]
    assert len(sticky) == 1 and sticky[0].repeat_action_probability == pytest.approx(0.25)
    assert capture_problem(env) is None
    env.close()
    env = make_env("PongNoFrameskip-v4", seed=0, horizon=50, frame_skip=2, noop_max=0)
    assert not any(isinstance(layer, gym.wrappers.StickyAction) for layer in _layers(env))
    env.reset(seed=0)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated) and steps < 1000:
        *_, terminated, truncated, _ = env.step(0)
        steps += 1
    assert truncated and steps == 50, "horizon counts agent steps (frame_skip frames each)"
    env.close()


def _play(env, steps, seed=0):
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    events = []
    for t in range(steps):
        obs, reward, terminated, truncated, info = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            before = obs
            obs, _ = env.reset()
            events.append((t, terminated, info["traj_done"], env.unwrapped.ale.lives(), np.array_equal(obs, before)))
    return events


def test_episodic_lives_ends_the_episode_not_the_game():
    env = make_env("ALE/Breakout-v5", seed=0, episodic_lives=True, repeat_action_probability=0.0)
    assert isinstance(env, EpisodicLives)
    events = _play(env, 600)
    life_losses = [e for e in events if not e[2]]
    assert life_losses, "no life was lost in 600 random steps"
    for _, terminated, _, lives, same_obs in life_losses:
        assert terminated and lives > 0 and same_obs, "a life loss must end the RL episode but not reset the game"
    games = [e for e in events if e[2]]
    assert games and games[0][3] == 5, "game over resets the game (5 lives again)"
    env.close()


def test_episodic_lives_state_round_trip():
    env = make_env("ALE/Breakout-v5", seed=0, episodic_lives=True)
    _play(env, 60)
    state = pickle.loads(pickle.dumps(env.state_dict()))
    other = make_env("ALE/Breakout-v5", seed=1, episodic_lives=True)
    other.load_state_dict(state)
    assert other.lives == env.lives and other.game_over == env.game_over
    np.testing.assert_array_equal(other.last_observation, env.last_observation)


def test_minatar_images():
    pytest.importorskip("minatar", reason="needs minatar: pip install 'tdrl[minatar]'")
    specs = EnvFactory("MinAtar/Breakout-v1").specs()
    assert tuple(specs.observation_spec.shape) == (4, 10, 10) and specs.n_actions == 3
    env = make_env("MinAtar/Breakout-v1", seed=0)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 255} and obs.any()
