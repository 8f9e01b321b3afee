""":class:`BatchCollector`: the one implementation of the :class:`~tdrl.collect.common.Collector` protocol.

Every collector kind is a ``BatchCollector`` over an *engine* (serial, parallel, action-server, TorchRL) that
produces one ``[batch_B, batch_T]`` batch per call; the collector adds what they share: the frame budget, the
exploration type of each batch, what ``collect()`` hands out, weights and shutdown.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol, Self

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType

from tdrl.collect.common import active_exploration, to_interaction_type

__all__ = ["BatchCollector", "Engine"]


class Engine(Protocol):
    """Produces batches for a :class:`BatchCollector` with the current weights of ``policy`` (``None``: random
    actions)."""

    batch_B: int
    batch_T: int
    policy: torch.nn.Module | None

    def run(self, exploration: InteractionType) -> tuple[TensorDictBase, list[dict[str, float]]]:
        """One batch (an engine may reuse its buffer) and the episodes finished during it."""

    def state_dict(self) -> dict[str, Any]:
        """What the next batch continues from (read between batches); picklable with ``torch.save``."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` of an engine built with the same arguments."""

    def shutdown(self) -> None: ...


class BatchCollector:
    """Yields the engine's ``[batch_B, batch_T]`` batches until ``total_frames`` (``-1``: forever).

    Args:
        engine: the batch producer (built by :func:`tdrl.collect.make_collector`).
        total_frames: iteration stops once this many frames were yielded.
        exploration_type: TorchRL exploration type the policy runs under, or its name; ``None`` follows the
            caller's ``set_exploration_type`` at each batch and is RANDOM outside one (as TorchRL's collectors).
        device: device of the yielded batches.
        return_same_td: yield the engine's buffer itself (no copy; overwritten by the next batch).
        transform: the TorchRL transform the engine's slices apply (their state: :meth:`transform_state`).

    Attributes:
        traj_infos: TrajInfo dicts of the episodes that finished during the last batch, in (step, env) order.
        frames: frames yielded so far; ``batches``: batches yielded so far.
        transform: the TorchRL transform given at build (a template: each slice holds its own copy), or ``None``.
    """

    def __init__(self, engine: Engine, *, total_frames: int = -1, exploration_type: InteractionType | str | None = None,
            device: torch.device | str | None = None, return_same_td: bool = False, transform: Any = None) -> None:
        self.engine = engine
        self.batch_B, self.batch_T = engine.batch_B, engine.batch_T
        self.frames_per_batch = self.batch_B * self.batch_T
        if total_frames == 0 or total_frames < -1:
            raise ValueError(f"total_frames must be positive or -1 (endless), got {total_frames}")
        self.total_frames, self.frames, self.batches = total_frames, 0, 0
        self.exploration_type = to_interaction_type(exploration_type)
        self.device = torch.device("cpu" if device is None else device)
        self.return_same_td = return_same_td
        self.traj_infos: list[dict[str, float]] = []
        self.transform = transform
        self.closed = False

    @property
    def policy(self) -> torch.nn.Module | None:
        """The policy the collector acts with (``None``: random actions)."""
        return self.engine.policy

    def collect(self) -> TensorDictBase:
        """Collect one batch (rlpyt's ``obtain_samples``); sets :attr:`traj_infos`."""
        if self.closed:
            raise RuntimeError("collector is shut down")
        batch, self.traj_infos = self.engine.run(active_exploration(self.exploration_type))
        self.frames += self.frames_per_batch
        self.batches += 1
        if self.device.type != "cpu" and not self._on_device(batch):
            return batch.to(self.device)
        return batch if self.return_same_td else batch.clone()

    def _on_device(self, batch: TensorDictBase) -> bool:
        """The batch is already on :attr:`device` (a batched env's, simulated there; ``cuda`` means any index)."""
        here = batch.device
        return here is not None and here.type == self.device.type and self.device.index in (None, here.index)

    def __iter__(self) -> Iterator[TensorDictBase]:
        while self.total_frames < 0 or self.frames < self.total_frames:
            yield self.collect()

    def __len__(self) -> int:
        if self.total_frames < 0:
            raise TypeError("an endless collector (total_frames=-1) has no length")
        return math.ceil(self.total_frames / self.frames_per_batch)

    def update_policy_weights_(self, policy_or_weights: Any = None) -> None:
        """Load given weights (a module, a TensorDict of parameters or a ``state_dict``) into the policy. Engines act
        with the policy's current weights at every batch anyway (TorchRL's protocol)."""
        policy, weights = self.engine.policy, policy_or_weights
        if policy is None or weights is None or weights is policy:
            return
        if isinstance(weights, torch.nn.Module):
            policy.load_state_dict(weights.state_dict())
        elif isinstance(weights, TensorDictBase):
            TensorDict.from_module(policy).data.update_(weights)
        elif isinstance(weights, dict):
            policy.load_state_dict(weights)
        else:
            raise TypeError(f"policy_or_weights must be a module, a TensorDict of parameters or a state_dict, "
                            f"got {type(weights)}")

    def state_dict(self) -> dict[str, Any]:
        """Counters (``frames``, ``iter``) and the engine's state (``engine``): every env's state, its current
        observation, the episodes in progress, recurrent policy state and worker RNGs. Call between batches."""
        return {"frames": self.frames, "iter": self.batches, "engine": self.engine.state_dict()}

    def transform_state(self) -> dict[str, Any] | None:
        """The first slice's transform ``state_dict`` as it stands (e.g. worker 0's ``VecNorm`` statistics), for an
        evaluator that sees observations as the policy does; ``None`` without a tdrl-kind transform. Call between
        batches (a parallel collector asks its workers)."""
        if self.transform is None:
            return None
        slices = self.engine.state_dict().get("slices") or [{}]
        return slices[0].get("transform")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` of a collector built with the same arguments: its next batches are
        those the saved one would have yielded (bitwise, with the caller's torch RNG restored as the trainer
        does; an env whose state cannot be captured starts a fresh episode, see the build-time warning)."""
        if "engine" in state_dict:  # absent in checkpoints written before env state was captured
            self.engine.load_state_dict(state_dict["engine"])
        self.frames, self.batches = int(state_dict["frames"]), int(state_dict["iter"])

    def shutdown(self) -> None:
        """Stop the engine's envs and processes; safe to call more than once."""
        if not self.closed:
            self.closed = True
            self.engine.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # a half-built or already-finalised collector: nothing left to release
            pass

    def __repr__(self) -> str:
        return f"BatchCollector({type(self.engine).__name__}, batch_B={self.batch_B}, batch_T={self.batch_T}, " \
               f"frames={self.frames})"
