"""What every collector kind shares: the :class:`Collector` protocol, argument checks, the frame budget."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, Self

from tensordict import TensorDictBase
from tensordict.nn import InteractionType
from torchrl.envs.utils import exploration_type

from tdrl.envs.make import EnvSpecs

__all__ = [
    "Collector", "CollectorError", "active_exploration", "check_batch_args", "env_specs", "sorted_infos",
    "to_interaction_type"
]

_RESET_MODES = ("reset_at_once", "wait_reset")


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
    if reset_mode not in _RESET_MODES:
        raise ValueError(f"reset_mode must be one of {_RESET_MODES}, got {reset_mode!r}")
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


def to_interaction_type(value: InteractionType | str | None) -> InteractionType | None:
    """Accept TorchRL's ``ExplorationType`` or its name (``"random"``, ``"deterministic"``, ``"mode"``...)."""
    if value is None or isinstance(value, InteractionType):
        return value
    try:
        return InteractionType.from_str(str(value))
    except Exception:
        names = [m.name.lower() for m in InteractionType]
        raise ValueError(f"exploration_type must be one of {names}, got {value!r}") from None


def active_exploration(explicit: InteractionType | str | None) -> InteractionType:
    """Exploration type for the next batch: the collector's own if given, else the one active in the caller
    (TorchRL's ``set_exploration_type`` around ``collect()``), else RANDOM (TorchRL's collector default)."""
    return to_interaction_type(explicit) or exploration_type() or InteractionType.RANDOM


def sorted_infos(entries: list[tuple[int, int, dict[str, float]]]) -> list[dict[str, float]]:
    """Order finished episodes by (time step, env index): the same order whichever process stepped them."""
    return [info for _, _, info in sorted(entries, key=lambda e: (e[0], e[1]))]
