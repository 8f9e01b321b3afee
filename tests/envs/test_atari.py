"""Atari with rlpyt's options: AtariFrames against gymnasium's wrapper stack, sticky actions, exact resume, the
extra, episodic lives, horizon, MinAtar."""

from __future__ import annotations

import pickle
from importlib import metadata
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import tomllib

from tdrl.envs import EnvFactory, capture_problem, get_env_state, make_env, set_env_state
from tdrl.envs.atari import AtariFrames, EpisodicLives, make_atari

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
    assert names & cv2_dists, f"the atari extra {extra} installs none of {cv2_dists} (AtariFrames resizes with cv2)"
    assert "ale-py" in names


def test_atari_env_observations_and_options():
    env = make_env("ALE/Pong-v5", seed=0)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    # sticky actions by AtariFrames right above the emulator (ALE's own cannot be checkpointed)
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    frames = [layer for layer in _layers(env) if isinstance(layer, AtariFrames)]
    assert len(frames) == 1 and frames[0].repeat_action_probability == pytest.approx(0.25)
    assert capture_problem(env) is None
    first, second = env.step(0)[0], env.step(0)[0]
    assert not np.shares_memory(first, second) and not np.shares_memory(second, frames[0].frames)
    env.close()
    env = make_env("PongNoFrameskip-v4", seed=0, horizon=50, frame_skip=2, noop_max=0)
    assert env.env.repeat_action_probability == 0.0 and env.env.frame_skip == 2
    env.reset(seed=0)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated) and steps < 1000:
        *_, terminated, truncated, _ = env.step(0)
        steps += 1
    assert truncated and steps == 50, "horizon counts agent steps (frame_skip frames each)"
    env.close()


def _gymnasium_stack(env_id, sticky, noop_max):
    """make_atari's former preprocessing, from gymnasium's wrappers: the reference AtariFrames must equal."""
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0, max_num_frames_per_episode=0,
                   max_episode_steps=-1, obs_type="grayscale")
    if sticky > 0:
        env = gym.wrappers.StickyAction(env, repeat_action_probability=sticky)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=4, screen_size=84)
    return gym.wrappers.FrameStackObservation(env, 4)


@pytest.mark.parametrize(("env_id", "sticky", "noop_max", "steps"), [
    ("ALE/Pong-v5", 0.0, 0, 500),
    ("ALE/Breakout-v5", 0.25, 30, 600),  # game overs (stopping mid-step), sticky and no-op draws from np_random
])
def test_frames_equal_the_gymnasium_wrapper_stack_bitwise(env_id, sticky, noop_max, steps):
    reference = _gymnasium_stack(env_id, sticky, noop_max)
    env = make_atari(env_id, repeat_action_probability=sticky, noop_max=noop_max, horizon=-1)
    assert isinstance(env, AtariFrames)
    expected, got = reference.reset(seed=3), env.reset(seed=3)
    np.testing.assert_array_equal(got[0], expected[0])
    assert got[1] == expected[1]
    rng, game_overs = np.random.default_rng(0), 0
    for t in range(steps):
        action = int(rng.integers(env.action_space.n))
        (obs, *outcome), (expected_obs, *expected_outcome) = env.step(action), reference.step(action)
        np.testing.assert_array_equal(obs, expected_obs, err_msg=f"step {t}")
        assert outcome == expected_outcome, f"step {t}"  # reward, terminated, truncated, info
        assert type(outcome[0]) is type(expected_outcome[0])
        if outcome[1] or outcome[2]:
            game_overs += 1
            np.testing.assert_array_equal(env.reset()[0], reference.reset()[0])
    assert game_overs > 0 or env_id == "ALE/Pong-v5"


class FrozenALE:
    """The real emulator that records the actions it is given instead of playing them (so the game never ends)."""

    def __init__(self, ale):
        self.ale, self.taken = ale, []

    def act(self, action):
        self.taken.append(action)
        return 0

    def __getattr__(self, name):
        return getattr(self.ale, name)


@pytest.mark.parametrize("sticky", [0.0, 0.25])
def test_sticky_actions_repeat_the_previous_frames_action_at_their_rate(sticky):
    env = make_atari("ALE/Pong-v5", repeat_action_probability=sticky, noop_max=0, horizon=-1)
    env.reset(seed=0)
    env.ale = frozen = FrozenALE(env.ale)
    requested = []
    for t in range(10_000):  # alternate two actions, so that every step's first frame may repeat the previous one
        requested += [2 + t % 2] * env.frame_skip
        env.step(2 + t % 2)
    taken = [env.actions.index(action) for action in frozen.taken]
    assert taken[0] == requested[0], "no repeat on the first frame after a reset"
    candidates = repeats = 0
    for previous, action, wanted in zip(taken[:-1], taken[1:], requested[1:], strict=True):
        assert action in (wanted, previous), "a frame takes the agent's action or repeats the previous frame's"
        if previous != wanted:
            candidates, repeats = candidates + 1, repeats + (action == previous)
    assert candidates >= 9999 and repeats / candidates == pytest.approx(sticky, abs=0.01)


def test_saved_state_reproduces_the_next_steps_bitwise():
    # sticky actions, no-op starts and lives: 100 steps from the save point cross life losses
    env, other = (make_env("ALE/Breakout-v5", seed=seed, episodic_lives=True) for seed in (0, 1))
    _play(env, 80)
    state = pickle.loads(pickle.dumps(get_env_state(env)))
    actions = np.random.default_rng(5).integers(env.action_space.n, size=100)

    def play(env):
        steps = []
        for action in actions:
            obs, reward, terminated, truncated, _ = env.step(int(action))
            steps.append((obs, reward, terminated, truncated))
            if terminated or truncated:
                steps.append(env.reset()[0])
        return steps

    expected = play(env)
    set_env_state(other, state)
    for got, want in zip(play(other), expected, strict=True):
        if isinstance(want, np.ndarray):
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_array_equal(got[0], want[0])
            assert got[1:] == want[1:]


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
