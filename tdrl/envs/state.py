"""Environment state for exact resume: what an env needs to continue its episode as if never interrupted.

A checkpoint stores each layer of an env's wrapper chain (outermost ``.env`` down to ``unwrapped``) and its action
space RNG. A layer is captured through its own :class:`StatefulEnv` methods (tdrl's wrappers have them) or, for the
third-party layers tdrl ships, through a small adapter that uses public attributes and public APIs only. Any other
layer makes the env not capturable: :func:`capture_problem` names it, and a resumed run starts that env on a fresh
episode.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

__all__ = ["EnvStateError", "StatefulEnv", "capture_problem", "get_env_state", "set_env_state"]


class EnvStateError(RuntimeError):
    """An env's state cannot be captured, or a state does not fit the env it is loaded into."""


class StatefulEnv(Protocol):
    """A layer (env or wrapper) that checkpoints itself, the torch way. ``state_dict`` returns copies that later
    steps do not change, made of picklable values (numpy arrays, python scalars, bytes)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


Getter = Callable[[Any], dict[str, Any]]
Setter = Callable[[Any, dict[str, Any]], None]


def _attributes(*names: str) -> tuple[Getter, Setter]:
    """Adapter of an env whose state is its public attributes ``names`` and its ``np_random``."""

    def get(layer: Any) -> dict[str, Any]:
        state = {name: copy.deepcopy(getattr(layer, name, None)) for name in names}
        return {**state, "np_random": layer.np_random.bit_generator.state}

    def set_(layer: Any, state: dict[str, Any]) -> None:
        for name in names:
            setattr(layer, name, copy.deepcopy(state[name]))
        layer.np_random.bit_generator.state = state["np_random"]

    return get, set_


def _stateless() -> tuple[Getter, Setter]:
    return (lambda layer: {}), (lambda layer, state: None)


def _get_order(layer: Any) -> dict[str, Any]:
    return {"has_reset": layer.has_reset}


def _set_order(layer: Any, state: dict[str, Any]) -> None:
    if state["has_reset"] and not layer.has_reset:
        raise EnvStateError("reset the env once before set_env_state (OrderEnforcing would refuse its next step)")


def _get_mujoco(env: Any) -> dict[str, Any]:
    import mujoco

    physics = np.empty(mujoco.mj_stateSize(env.model, mujoco.mjtState.mjSTATE_INTEGRATION))
    mujoco.mj_getState(env.model, env.data, physics, mujoco.mjtState.mjSTATE_INTEGRATION)
    return {"physics": physics, "xpos": env.data.xpos.copy(), "xipos": env.data.xipos.copy(),
            "np_random": env.np_random.bit_generator.state}


def _set_mujoco(env: Any, state: dict[str, Any]) -> None:
    import mujoco

    mujoco.mj_setState(env.model, env.data, state["physics"], mujoco.mjtState.mjSTATE_INTEGRATION)
    env.data.xpos[...] = state["xpos"]
    env.data.xipos[...] = state["xipos"]
    env.np_random.bit_generator.state = state["np_random"]


def _get_ale(env: Any) -> dict[str, Any]:
    return {"ale": env.ale.cloneState(include_rng=True).serialize(), "np_random": env.np_random.bit_generator.state}


def _set_ale(env: Any, state: dict[str, Any]) -> None:
    import ale_py

    env.ale.restoreState(ale_py.ALEState(state["ale"]))
    env.np_random.bit_generator.state = state["np_random"]


def _get_minatar(env: Any) -> dict[str, Any]:
    return {"game": pickle.dumps(env.game), "np_random": env.np_random.bit_generator.state}


def _set_minatar(env: Any, state: dict[str, Any]) -> None:
    env.game = pickle.loads(state["game"])
    env.np_random.bit_generator.state = state["np_random"]


# Third-party layers, by the qualified name of the library class (no import of mujoco, ale_py or minatar to look them
# up).
_ADAPTERS: dict[str, tuple[Getter, Setter]] = {
    # classic control: the dynamics state, CartPole's steps-after-termination counter, Pendulum's last torque
    "gymnasium.envs.classic_control.cartpole.CartPoleEnv": _attributes("state", "steps_beyond_terminated"),
    "gymnasium.envs.classic_control.pendulum.PendulumEnv": _attributes("state", "last_u"),
    "gymnasium.envs.classic_control.acrobot.AcrobotEnv": _attributes("state"),
    "gymnasium.envs.classic_control.mountain_car.MountainCarEnv": _attributes("state"),
    "gymnasium.envs.classic_control.continuous_mountain_car.Continuous_MountainCarEnv": _attributes("state"),
    # MuJoCo: the integration state (qpos, qvel, act, warm start, time, controls...) plus the body positions the
    # envs read before stepping (Ant's torso, Humanoid's centre of mass), which mj_step leaves at the last
    # substep's start instead of recomputing them from the state
    "gymnasium.envs.mujoco.mujoco_env.MujocoEnv": (_get_mujoco, _set_mujoco),
    # Atari: the emulator with its RNG; np_random draws tdrl's AtariFrames' no-op starts and sticky actions
    "ale_py.env.AtariEnv": (_get_ale, _set_ale),
    # MinAtar: its public `game` (minatar.Environment: the game, the previous action that sticky actions repeat,
    # their RandomState and the game's, one object once seeded) pickled whole, so a shared RandomState stays
    # shared; np_random is what wrappers above draw from (MinAtar itself draws nothing from it)
    "minatar.gym.BaseEnv": (_get_minatar, _set_minatar),
    # remembers only whether reset was called / checks only the first reset and step
    "gymnasium.wrappers.common.OrderEnforcing": (_get_order, _set_order),
    "gymnasium.wrappers.common.PassiveEnvChecker": _stateless(),
}
_LIBRARIES = ("gymnasium", "ale_py", "minatar")


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _layers(env: gym.Env) -> list[Any]:
    """The wrapper chain, outermost first, ending with the unwrapped env."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _getter_setter(layer: Any) -> tuple[Getter, Setter]:
    """:func:`_accessors` of a layer :func:`capture_problem` accepted."""
    accessors = _accessors(layer)
    if accessors is None:
        raise EnvStateError(f"env layer {_class_name(type(layer))} cannot be captured")
    return accessors


def _accessors(layer: Any) -> tuple[Getter, Setter] | None:
    """How to get and set a layer's state: its own protocol methods, else the adapter of a library class it
    derives from. A subclass defined outside those libraries may keep more state, so it must implement the
    protocol itself."""
    own = type(layer)  # not isinstance(layer, StatefulEnv): a runtime protocol check costs ~50 µs per layer
    if callable(getattr(own, "state_dict", None)) and callable(getattr(own, "load_state_dict", None)):
        return own.state_dict, own.load_state_dict
    if own.__module__.partition(".")[0] not in _LIBRARIES:
        return None
    for cls in own.__mro__:
        if _class_name(cls) in _ADAPTERS:
            return _ADAPTERS[_class_name(cls)]
    return None


def capture_problem(env: gym.Env) -> str | None:
    """None when every layer of ``env`` can be captured, else one sentence naming the first layer that cannot and
    what to do about it."""
    fresh = "; until then a resumed run starts this env on a fresh episode"
    for layer in _layers(env):
        if _accessors(layer) is None:
            todo = ("build the env with tdrl.envs.make_env, or gymnasium.make(..., max_episode_steps=-1) wrapped in "
                    "tdrl.envs.TimeLimit" if type(layer) is gym.wrappers.TimeLimit else
                    "implement state_dict()/load_state_dict() on it (tdrl.envs.StatefulEnv)")
            return f"env layer {_class_name(type(layer))} cannot be captured for exact resume: {todo}{fresh}"
    base: Any = env.unwrapped  # ale_py's AtariEnv has an ale (gymnasium's types do not know it)
    if _class_name(type(base)) == "ale_py.env.AtariEnv" and base.ale.getFloat("repeat_action_probability") > 0:
        return ("ALE's sticky actions keep the previous action outside its cloneState: build the env with "
                f"repeat_action_probability=0 and tdrl.envs.atari.AtariFrames (as tdrl.envs.make_env does){fresh}")
    return None


def _space_rng(space: gym.Space) -> Any:
    """The RNG state of an action space; a ``Dict``/``Tuple`` space samples from one RNG per subspace, so theirs
    too (a single space's state stays the bare bit-generator state: older checkpoints load unchanged)."""
    if isinstance(space, gym.spaces.Dict):
        return {"space": space.np_random.bit_generator.state,
                "subspaces": {key: _space_rng(sub) for key, sub in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"space": space.np_random.bit_generator.state, "subspaces": [_space_rng(sub) for sub in space.spaces]}
    return space.np_random.bit_generator.state


def _set_space_rng(space: gym.Space, state: Any) -> None:
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        space.np_random.bit_generator.state = state["space"]
        subspaces = state["subspaces"]
        pairs = ([(sub, subspaces[key]) for key, sub in space.spaces.items()] if isinstance(space, gym.spaces.Dict)
                 else list(zip(space.spaces, subspaces, strict=True)))
        for sub, sub_state in pairs:
            _set_space_rng(sub, sub_state)
        return
    space.np_random.bit_generator.state = state


def get_env_state(env: gym.Env) -> dict[str, Any]:
    """Every layer's state (outermost first) and the action space RNG, picklable; raises :class:`EnvStateError`
    when ``env`` cannot be captured (see :func:`capture_problem`)."""
    problem = capture_problem(env)
    if problem is not None:
        raise EnvStateError(problem)
    layers = [{"class": _class_name(type(layer)), "state": _getter_setter(layer)[0](layer)} for layer in _layers(env)]
    return {"layers": layers, "action_space_rng": _space_rng(env.action_space)}


def set_env_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Restore ``state`` into an env built by the same factory and reset at least once. Raises
    :class:`EnvStateError` when its layers differ from the state's (before changing anything) or it was never
    reset."""
    layers = _layers(env)
    have = [_class_name(type(layer)) for layer in layers]
    want = [saved["class"] for saved in state["layers"]]
    if have != want:
        raise EnvStateError(f"env state does not fit this env: its layers are {want}, this env's are {have}")
    problem = capture_problem(env)
    if problem is not None:
        raise EnvStateError(problem)
    for layer, saved in zip(layers, state["layers"], strict=True):
        _getter_setter(layer)[1](layer, saved["state"])
    _set_space_rng(env.action_space, state["action_space_rng"])
