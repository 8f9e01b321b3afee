"""Env state capture: a restored env continues bitwise as the original, across episode ends and resets."""

import io
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control import CartPoleEnv

from tdrl.envs import (
    EnvFactory,
    EnvSpecs,
    EnvStateError,
    TimeLimit,
    capture_problem,
    get_env_state,
    make_env,
    set_env_state,
)


def _through_torch_save(state: dict[str, Any]) -> dict[str, Any]:
    """The path a state takes in a checkpoint."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _bits(x: Any) -> Any:
    """A value compared bit for bit (dtype included)."""
    x = np.asarray(x)
    return x.dtype.str, x.shape, x.tobytes()


def _play(env: gym.Env, actions: list[Any]) -> tuple[list[Any], int]:
    """Step through ``actions``, resetting (unseeded) after each episode end; returns what was seen and how many
    episodes ended. Ends with actions drawn from the action space, so its RNG is compared too."""
    seen, ends = [], 0
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        seen.append((_bits(obs), _bits(reward), bool(terminated), bool(truncated)))
        if terminated or truncated:
            ends += 1
            seen.append(("reset", _bits(env.reset()[0])))
    seen.append(("sampled", [_bits(env.action_space.sample()) for _ in range(8)]))
    return seen, ends


def _random_steps(env: gym.Env, k: int) -> int:
    ends = 0
    for _ in range(k):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            ends += 1
            env.reset()
    return ends


def _fixed_actions(env: gym.Env, m: int) -> list[Any]:
    space = env.action_space
    rng = np.random.default_rng(7)
    if isinstance(space, gym.spaces.Discrete):
        return [int(a) for a in rng.integers(space.n, size=m)]
    return [rng.uniform(space.low, space.high).astype(space.dtype) for _ in range(m)]


def _check_continuation(factory: EnvFactory, k: int, m: int, ends_before: int = 0) -> None:
    env = factory(seed=0)
    assert _random_steps(env, k) >= ends_before
    state = _through_torch_save(get_env_state(env))
    actions = _fixed_actions(env, m)
    expected, ends = _play(env, actions)
    assert ends >= 1, "the recorded steps must cross an episode end and its reset"

    fresh = factory(seed=123)
    fresh.reset(seed=456)
    fresh.step(fresh.action_space.sample())
    set_env_state(fresh, state)
    assert _play(fresh, actions)[0] == expected


CLASSIC = [
    (EnvFactory("CartPole-v1"), 1),  # random actions end an episode within ~20 steps
    (EnvFactory("tdrl/CartPoleNoVelocity-v1"), 1),  # R2D1's default env: the mask layer joins the protocol
    (EnvFactory("Pendulum-v1", {"max_episode_steps": 25}), 1),
    (EnvFactory("Acrobot-v1", {"max_episode_steps": 25}), 1),
    (EnvFactory("MountainCar-v0", {"max_episode_steps": 25}), 1),
    (EnvFactory("MountainCarContinuous-v0", {"max_episode_steps": 25}), 1),
]


@pytest.mark.parametrize(("factory", "ends_before"), CLASSIC, ids=[f.env_id for f, _ in CLASSIC])
def test_classic_control_continues_bitwise(factory, ends_before):
    _check_continuation(factory, k=60, m=60, ends_before=ends_before)


def test_time_limit_truncates_at_the_same_step_after_a_restore():
    factory = EnvFactory("Pendulum-v1", {"max_episode_steps": 50})
    env = factory(seed=0)
    reference = gym.make("Pendulum-v1", max_episode_steps=50)  # gymnasium's TimeLimit: the semantics to keep
    assert np.array_equal(env.reset(seed=1)[0], reference.reset(seed=1)[0])
    actions = _fixed_actions(env, 50)
    for action in actions[:20]:
        env.step(action)
    state = get_env_state(env)
    assert state["layers"][0] == {"class": "tdrl.envs.time_limit.TimeLimit", "state": {"elapsed_steps": 20}}

    restored = factory(seed=9)
    set_env_state(restored, state)
    steps_left = [restored.step(action)[3] for action in actions[20:]]
    assert steps_left == [False] * 29 + [True]
    truncations = [reference.step(action)[3] for action in actions]
    assert truncations == [False] * 49 + [True]


class Counter(gym.Wrapper):
    """A user's wrapper that keeps state without the protocol."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward + self.steps, terminated, truncated, info


class StatefulCounter(Counter):
    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]


class MyCartPole(CartPoleEnv):
    """A subclass may keep more state than the library class, so it is not adapted silently."""


def test_a_wrapper_without_the_protocol_is_named():
    env = Counter(make_env("CartPole-v1", seed=0))
    problem = capture_problem(env)
    assert problem is not None and "test_state.Counter" in problem and "state_dict()" in problem
    with pytest.raises(EnvStateError, match="test_state.Counter"):
        get_env_state(env)
    assert "MyCartPole" in capture_problem(TimeLimit(MyCartPole(), 10))
    assert "tdrl.envs.make_env" in capture_problem(gym.make("CartPole-v1"))  # gymnasium's private counter
    assert EnvFactory("CartPole-v1").specs().capture_problem is None
    assert "test_state.Counter" in EnvSpecs.from_env(env).capture_problem  # what collectors warn with, once


def test_a_wrapper_with_the_protocol_is_captured():
    def factory(seed):
        return StatefulCounter(make_env("CartPole-v1", seed=seed))

    assert capture_problem(factory(0)) is None
    _check_continuation(factory, k=30, m=60)


def test_mismatched_layers_raise():
    cartpole, pendulum = make_env("CartPole-v1", seed=0), make_env("Pendulum-v1", seed=0)
    with pytest.raises(EnvStateError, match="does not fit"):
        set_env_state(pendulum, get_env_state(cartpole))
    with pytest.raises(EnvStateError, match="does not fit"):
        set_env_state(StatefulCounter(make_env("CartPole-v1", seed=0)), get_env_state(cartpole))
    with pytest.raises(EnvStateError, match="reset the env once"):
        set_env_state(make_env("CartPole-v1"), get_env_state(cartpole))


MUJOCO = [
    (EnvFactory("HalfCheetah-v5", {"max_episode_steps": 25}), 1),
    (EnvFactory("Hopper-v5"), 1),  # random actions make it fall (terminate) within ~30 steps
    (EnvFactory("Ant-v5", {"max_episode_steps": 25}), 1),  # contact forces (cfrc_ext) in its obs
    (EnvFactory("Humanoid-v5"), 1),  # reads its centre of mass (xipos) before stepping; falls within ~25 steps
]


@pytest.mark.parametrize(("factory", "ends_before"), MUJOCO, ids=[f.env_id for f, _ in MUJOCO])
def test_mujoco_continues_bitwise(factory, ends_before):
    pytest.importorskip("mujoco", reason="MuJoCo envs need gymnasium[mujoco]")
    _check_continuation(factory, k=60, m=60, ends_before=ends_before)


ATARI = [
    # the horizon (agent steps) ends episodes within the recorded steps; sticky actions and the no-op starts
    # (np_random) matter
    (EnvFactory("ALE/Pong-v5", {"max_episode_steps": 40}), 1),
    (EnvFactory("PongNoFrameskip-v4", {"max_episode_steps": 40}), 1),
]


@pytest.mark.parametrize(("factory", "ends_before"), ATARI, ids=[f.env_id for f, _ in ATARI])
def test_atari_continues_bitwise(factory, ends_before):
    pytest.importorskip("ale_py", reason="Atari envs need ale-py: pip install 'tdrl[atari]'")
    _check_continuation(factory, k=60, m=60, ends_before=ends_before)


STICKY = [(EnvFactory("ALE/Pong-v5", {"max_episode_steps": 40}), "ale_py", 15),
          (EnvFactory("MinAtar/Breakout-v1"), "minatar", 30)]


@pytest.mark.parametrize(("factory", "module", "captures"), STICKY, ids=[f.env_id for f, _, _ in STICKY])
def test_sticky_actions_continue_bitwise_from_any_step(factory, module, captures):
    # a sticky repeat of the action before the capture shows only from some capture points
    pytest.importorskip(module)
    env, fresh = factory(seed=0), factory(seed=1)
    _random_steps(env, 50)
    actions = _fixed_actions(env, 10)
    for _ in range(captures):
        _random_steps(env, 1)  # resets after an episode end (a MinAtar game over stays over)
        state = get_env_state(env)
        expected, _ = _play(env, actions)
        set_env_state(fresh, state)
        assert _play(fresh, actions)[0] == expected
        set_env_state(env, state)  # back to the capture point, to go on from there


MINATAR = [EnvFactory("MinAtar/Breakout-v1"), EnvFactory("MinAtar/Asterix-v1")]


@pytest.mark.parametrize("factory", MINATAR, ids=[f.env_id for f in MINATAR])
def test_minatar_continues_bitwise(factory):
    # MinAtar's sticky actions (0.1 by default) repeat the previous action with draws from the game's RandomState,
    # which a seeded game shares with its own (Asterix draws from it for spawns every step)
    pytest.importorskip("minatar", reason="needs minatar: pip install 'tdrl[minatar]'")
    env = factory(seed=0)
    assert capture_problem(env) is None and factory.specs().capture_problem is None
    assert env.unwrapped.game.sticky_action_prob == 0.1
    _check_continuation(factory, k=60, m=200, ends_before=1)


@pytest.mark.parametrize("factory", MINATAR, ids=[f.env_id for f in MINATAR])
def test_minatar_state_is_a_function_of_the_seed(factory):
    # MinAtar's reset seeds only its game; left unseeded, np_random would start from OS entropy in every process and
    # an uninterrupted run's checkpoints would differ from a resumed one's
    pytest.importorskip("minatar", reason="needs minatar: pip install 'tdrl[minatar]'")
    states = [get_env_state(factory(seed=5)) for _ in range(2)]
    assert states[0]["layers"][-1]["state"]["np_random"] == states[1]["layers"][-1]["state"]["np_random"]


def test_sticky_actions_inside_ale_are_reported():
    pytest.importorskip("ale_py", reason="Atari envs need ale-py: pip install 'tdrl[atari]'")
    # ALE's own sticky actions (gymnasium's default for ALE/ ids): its previous action is not in cloneState
    assert "sticky actions" in capture_problem(gym.make("ALE/Pong-v5"))
    assert make_env("ALE/Pong-v5").env.repeat_action_probability == 0.25  # tdrl.envs.atari.AtariFrames
