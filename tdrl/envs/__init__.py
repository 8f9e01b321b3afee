"""Environments: gymnasium envs by id as picklable constructors, with TorchRL specs."""

from tdrl.envs.make import EnvError, EnvFactory, EnvSpecs, make_env, space_to_spec

__all__ = ["EnvError", "EnvFactory", "EnvSpecs", "make_env", "space_to_spec"]
