"""What every collector kind shares: the :class:`Collector` protocol, argument checks, the frame budget."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol, Self

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType
from torchrl.envs.utils import exploration_type

from tdrl.envs.make import EnvSpecs

__all__ = [
    "RESET_MODES",
    "Collector",
    "CollectorError",
    "FrameBudget",
    "active_exploration",
    "check_batch_args",
    "env_specs",
    "load_weights",
    "sorted_infos",
    "to_interaction_type",
]

RESET_MODES = ("reset_at_once", "wait_reset")


class CollectorError(RuntimeError):
    """A collector worker died or an env raised; the message names the worker and carries its traceback."""


class Collector(Protocol):
    """TorchRL's collector protocol, as tdrl's trainers use it.

    Iterating yields ``[batch_B, batch_T]`` TensorDicts until ``total_frames`` (``-1``: forever); ``collect()``
    returns one batch; ``traj_infos`` holds the episodes finished during the last one.
    """

    frames: int
    frames_per_batch: int
    traj_infos: list[dict[str, float]]

    def __iter__(self) -> Iterator[TensorDictBase]: ...
    def collect(self) -> TensorDictBase: ...
    def update_policy_weights_(self, policy_or_weights: Any = None) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...
    def shutdown(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: Any) -> None: ...


def check_batch_args(batch_B: int, batch_T: int, reset_mode: str, n_workers: int = 1) -> None:
    """Validate the common collector arguments, naming the offending one."""
    if not isinstance(batch_B, int) or batch_B < 1:
        raise ValueError(f"batch_B must be a positive int (number of envs), got {batch_B!r}")
    if not isinstance(batch_T, int) or batch_T < 1:
        raise ValueError(f"batch_T must be a positive int (time steps per batch), got {batch_T!r}")
    if reset_mode not in RESET_MODES:
        raise ValueError(f"reset_mode must be one of {RESET_MODES}, got {reset_mode!r}")
    if not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"n_workers must be a positive int, got {n_workers!r}")
    if batch_B % n_workers:
        raise ValueError(f"batch_B={batch_B} must be divisible by n_workers={n_workers}")


def env_specs(env_factory: Callable[..., Any]) -> EnvSpecs:
    """TorchRL specs of the factory's env (uses ``EnvFactory.specs()`` when available)."""
    specs = getattr(env_factory, "specs", None)
    if callable(specs):
        return specs()
    env = env_factory()
    try:
        return EnvSpecs.from_env(env)
    finally:
        env.close()


def to_interaction_type(value: InteractionType | str | None, default: InteractionType | None) -> InteractionType | None:
    """Accept TorchRL's ``ExplorationType`` or its name (``"random"``, ``"deterministic"``, ``"mode"``...)."""
    if value is None:
        return default
    if isinstance(value, InteractionType):
        return value
    try:
        return InteractionType.from_str(str(value))
    except Exception:
        names = [m.name.lower() for m in InteractionType]
        raise ValueError(f"exploration_type must be one of {names}, got {value!r}") from None


def active_exploration(explicit: InteractionType | str | None) -> InteractionType:
    """Exploration type for the next batch: the collector's own if given, else the one active in the caller
    (TorchRL's ``set_exploration_type`` around ``collect()``), else RANDOM (TorchRL's collector default)."""
    return to_interaction_type(explicit, None) or exploration_type() or InteractionType.RANDOM


class FrameBudget:
    """TorchRL's ``total_frames`` semantics: keep yielding batches until ``total_frames`` (``-1``: forever)."""

    def __init__(self, total_frames: int | None, frames_per_batch: int) -> None:
        total_frames = -1 if total_frames is None else total_frames
        if total_frames == 0 or total_frames < -1:
            raise ValueError(f"total_frames must be positive or -1 (endless), got {total_frames}")
        self.total_frames = int(total_frames)
        self.frames_per_batch = frames_per_batch
        self.frames = 0
        self.batches = 0

    def remaining(self) -> bool:
        return self.total_frames < 0 or self.frames < self.total_frames

    def count(self) -> None:
        self.frames += self.frames_per_batch
        self.batches += 1

    def __len__(self) -> int:
        if self.total_frames < 0:
            raise TypeError("an endless collector (total_frames=-1) has no length")
        return math.ceil(self.total_frames / self.frames_per_batch)

    def state_dict(self) -> dict[str, int]:
        return {"frames": self.frames, "iter": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.frames = int(state["frames"])
        self.batches = int(state["iter"])


def sorted_infos(entries: list[tuple[int, int, dict[str, float]]]) -> list[dict[str, float]]:
    """Order finished episodes by (time step, env index): the same order whichever process stepped them."""
    return [info for _, _, info in sorted(entries, key=lambda e: (e[0], e[1]))]


def load_weights(policy: torch.nn.Module | None, weights: Any) -> None:
    """Copy weights (a module, a TensorDict of parameters, or a ``state_dict``) into ``policy`` in place; nothing
    to do for ``None`` or the policy itself."""
    if policy is None or weights is None or weights is policy:
        return
    if isinstance(weights, torch.nn.Module):
        policy.load_state_dict(weights.state_dict())
    elif isinstance(weights, TensorDictBase):
        TensorDict.from_module(policy).data.update_(weights)
    elif isinstance(weights, dict):
        policy.load_state_dict(weights)
    else:
        raise TypeError(
            f"policy_or_weights must be a module, a TensorDict of parameters or a state_dict, got {type(weights)}"
        )
