"""Environments: gymnasium envs by id as picklable constructors, with TorchRL specs, and their checkpointable state."""

from tdrl.envs.make import EnvError, EnvFactory, EnvSpecs, make_env, space_to_spec
from tdrl.envs.state import EnvStateError, StatefulEnv, capture_problem, get_env_state, set_env_state
from tdrl.envs.time_limit import TimeLimit

__all__ = [
    "EnvError",
    "EnvFactory",
    "EnvSpecs",
    "EnvStateError",
    "StatefulEnv",
    "TimeLimit",
    "capture_problem",
    "get_env_state",
    "make_env",
    "set_env_state",
    "space_to_spec",
]
