"""Environments: gymnasium envs by id as picklable constructors, with TorchRL specs, their families (what tdrl does
differently for Atari, MinAtar, MuJoCo, ...) and their checkpointable state."""

from tdrl.envs.families import EnvFamily, EnvTraits, family_of, register_family, traits_of
from tdrl.envs.make import EnvError, EnvFactory, EnvSpecs, make_env, space_to_spec
from tdrl.envs.state import EnvStateError, StatefulEnv, capture_problem, get_env_state, set_env_state
from tdrl.envs.time_limit import TimeLimit

__all__ = [
    "EnvError",
    "EnvFactory",
    "EnvFamily",
    "EnvSpecs",
    "EnvStateError",
    "EnvTraits",
    "StatefulEnv",
    "TimeLimit",
    "capture_problem",
    "family_of",
    "get_env_state",
    "make_env",
    "register_family",
    "set_env_state",
    "space_to_spec",
    "traits_of",
]
