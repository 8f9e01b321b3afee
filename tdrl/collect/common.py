"""Pieces every collector kind shares: argument checks, specs, the frame budget, policy-output writing."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Self

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType
from tensordict.utils import NestedKey

from tdrl.envs.make import EnvSpecs

__all__ = [
    "RESET_MODES",
    "active_exploration",
    "BufferedCollector",
    "ClosesOnExit",
    "CollectorBase",
    "CollectorError",
    "FrameBudget",
    "PolicyWriter",
    "check_batch_args",
    "env_specs",
    "game_score_of",
    "load_weights",
    "sorted_infos",
    "random_action_template",
    "to_interaction_type",
]

RESET_MODES = ("reset_at_once", "wait_reset")


class CollectorError(RuntimeError):
    """A collector worker died or an env raised; the message names the worker and carries its traceback."""


def check_batch_args(batch_B: int, batch_T: int, reset_mode: str, n_workers: int | None = None) -> None:
    """Validate the common collector arguments, naming the offending one."""
    if not isinstance(batch_B, int) or batch_B < 1:
        raise ValueError(f"batch_B must be a positive int (number of envs), got {batch_B!r}")
    if not isinstance(batch_T, int) or batch_T < 1:
        raise ValueError(f"batch_T must be a positive int (time steps per batch), got {batch_T!r}")
    if reset_mode not in RESET_MODES:
        raise ValueError(f"reset_mode must be one of {RESET_MODES}, got {reset_mode!r}")
    if n_workers is not None:
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


def game_score_of(env_factory: Any) -> bool:
    """Atari envs report ``GameScore`` in their TrajInfos."""
    return bool(getattr(env_factory, "is_atari", False))


def random_action_template(specs: EnvSpecs, n: int) -> TensorDict:
    """Policy template for ``policy=None``: only ``action`` (from the action spec)."""
    return TensorDict({"action": specs.action_spec.zero((n,))}, batch_size=[n])


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


def active_exploration(explicit: InteractionType | None) -> InteractionType:
    """Exploration type for the next batch: the collector's own if given, else the one active in the caller
    (TorchRL's ``set_exploration_type`` context around ``collect()``/iteration), else RANDOM (TorchRL's
    collector default)."""
    if explicit is not None:
        return explicit
    from tensordict.nn.probabilistic import interaction_type

    return interaction_type() or InteractionType.RANDOM


class FrameBudget:
    """TorchRL's ``total_frames`` semantics: keep yielding batches until ``total_frames`` (``-1``: forever)."""

    def __init__(self, total_frames: int, frames_per_batch: int) -> None:
        if total_frames is None:
            total_frames = -1
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


class PolicyWriter:
    """Writes policy outputs (a dict of ``[n, ...]`` tensors) into column ``t`` of batch rows ``lo:hi``."""

    def __init__(self, batch: TensorDictBase, keys: list[NestedKey], lo: int, hi: int) -> None:
        self.pairs = [(key, batch.get(key).numpy()[lo:hi]) for key in keys]

    def __call__(self, t: int, out: dict[NestedKey, torch.Tensor]) -> None:
        for key, dst in self.pairs:
            value = out[key]
            if value.device.type != "cpu":
                value = value.cpu()
            dst[:, t] = value.numpy()


def sorted_infos(entries: list[tuple[int, int, dict[str, float]]]) -> list[dict[str, float]]:
    """Order finished episodes by (time step, env index): the same order whichever process stepped them."""
    return [info for _, _, info in sorted(entries, key=lambda e: (e[0], e[1]))]


def load_weights(policy: torch.nn.Module, weights: Any) -> None:
    """Copy weights (a module, a TensorDict of parameters, or a ``state_dict``) into ``policy`` in place."""
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


class ClosesOnExit:
    """Context manager and finaliser calling an idempotent ``shutdown()`` (collectors own processes and envs)."""

    def shutdown(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # a half-built or already-finalised collector: nothing left to release
            pass


class CollectorBase(ClosesOnExit):
    """TorchRL's collector protocol over a frame budget: iteration until ``total_frames``, ``len``, the frame
    counters and their ``state_dict``, context management. A subclass sets ``budget``, ``batch_B`` and ``batch_T``
    and provides ``collect()`` and an idempotent ``shutdown()``."""

    budget: FrameBudget
    batch_B: int
    batch_T: int

    def collect(self) -> TensorDictBase:
        raise NotImplementedError

    @property
    def frames(self) -> int:
        return self.budget.frames

    @property
    def frames_per_batch(self) -> int:
        return self.batch_B * self.batch_T

    def __iter__(self) -> Iterator[TensorDictBase]:
        while self.budget.remaining():
            yield self.collect()

    def __len__(self) -> int:
        return len(self.budget)

    def state_dict(self) -> dict[str, Any]:
        """Counters (``frames``, ``iter``). Env state is not captured: resuming restarts episodes."""
        return self.budget.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.budget.load_state_dict(state_dict)


class BufferedCollector(CollectorBase):
    """A tdrl collector writing each batch into its preallocated ``buffer``: the exploration-type switch and the
    rule for what ``collect()`` hands out. A subclass also sets ``_exploration_arg``, ``buffer``, ``device`` and
    ``return_same_td``."""

    buffer: TensorDictBase
    device: torch.device
    return_same_td: bool
    _exploration_arg: InteractionType | None

    @property
    def exploration_type(self) -> InteractionType | None:
        """The fixed exploration type, or ``None`` to follow the caller's ``set_exploration_type``."""
        return self._exploration_arg

    @exploration_type.setter
    def exploration_type(self, value: InteractionType | str | None) -> None:
        self._exploration_arg = to_interaction_type(value, None)

    def _yielded_batch(self) -> TensorDictBase:
        """The batch handed to the caller: the buffer itself (``return_same_td``, CPU), else a copy on ``device``
        (the next ``collect()`` overwrites the buffer)."""
        if self.return_same_td and self.device.type == "cpu":
            return self.buffer
        return self.buffer.to(self.device) if self.device.type != "cpu" else self.buffer.clone()
