"""TorchRL's own collectors behind tdrl's collector interface (``make_collector("torchrl", ...)``).

Useful as a reference and when a TorchRL feature is needed (its env transforms with per-env state such as
``CatFrames``/``RewardSum``, its weight-sync schemes, ...), at TorchRL's speed (see benchmarks/collectors.py).
``n_workers == 1`` wraps ``torchrl.collectors.Collector(SerialEnv(batch_B))``; ``n_workers > 1`` wraps
``MultiSyncCollector`` with ``n_workers`` × ``SerialEnv(batch_B / n_workers)`` (the best TorchRL configurations
measured on a 2-core machine). Batches are reshaped to tdrl's ``[batch_B, batch_T]`` and get
``("collector", "mask")`` (all True); float64 observations are cast to float32 (``DoubleToFloat``), discrete
actions are indices. TrajInfos are computed from each batch's reward and done flags (after ``transform``).
Only reset-at-once is available, and no decorrelation steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.common import (
    CollectorBase,
    FrameBudget,
    check_batch_args,
    load_weights,
    sorted_infos,
    to_interaction_type,
)
from tdrl.collect.traj_info import EpisodeTracker

__all__ = ["TorchRLCollector"]


def _gym_env(env_factory: Callable[..., Any], transform: Any) -> Any:
    from torchrl.envs import Compose, DoubleToFloat, GymWrapper, TransformedEnv

    env = GymWrapper(env_factory(), categorical_action_encoding=True)
    transforms = []
    if any(spec.dtype == torch.float64 for spec in env.observation_spec.values(True, True)):
        transforms.append(DoubleToFloat())
    if transform is not None:
        transforms.append(transform)
    return TransformedEnv(env, Compose(*transforms)) if transforms else env


def _serial_env(env_factory: Callable[..., Any], n: int, transform: Any) -> Any:
    from torchrl.envs import SerialEnv

    return SerialEnv(n, functools.partial(_gym_env, env_factory, transform))


class TorchRLCollector(CollectorBase):
    """A TorchRL collector yielding tdrl-layout ``[batch_B, batch_T]`` batches with :attr:`traj_infos`.

    Arguments follow :class:`~tdrl.collect.ParallelCollector`; ``reset_mode`` must be ``"reset_at_once"`` and
    ``max_decorrelation_steps`` 0. ``transform`` is appended to each TorchRL env (any TorchRL transform).
    """

    def __init__(
        self,
        env_factory: Callable[..., Any],
        policy: TensorDictModuleBase | None = None,
        *,
        batch_B: int,
        batch_T: int,
        n_workers: int = 2,
        total_frames: int = -1,
        seed: int = 0,
        reset_mode: str = "reset_at_once",
        max_decorrelation_steps: int = 0,
        discount: float = 0.99,
        transform: Any = None,
        exploration_type: InteractionType | str | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        from torchrl.collectors import Collector, MultiSyncCollector

        check_batch_args(batch_B, batch_T, reset_mode, n_workers)
        if reset_mode != "reset_at_once":
            raise ValueError("reset_mode='wait_reset' is not available with TorchRL's collectors; use a tdrl kind")
        if max_decorrelation_steps:
            raise ValueError("max_decorrelation_steps is not available with TorchRL's collectors; use a tdrl kind")
        self.batch_B, self.batch_T, self.n_workers = batch_B, batch_T, n_workers
        self.budget = FrameBudget(total_frames, batch_B * batch_T)
        self.policy = policy
        self.traj_infos: list[dict[str, float]] = []
        self.tracker = EpisodeTracker(batch_B, discount=discount, game_score=bool(getattr(env_factory, "is_atari", False)))
        kwargs = dict(
            frames_per_batch=batch_B * batch_T,
            total_frames=-1,
            exploration_type=to_interaction_type(exploration_type, InteractionType.RANDOM),
            device=device,
            auto_register_policy_transforms=False,  # the env is built as given; no implicit InitTracker
        )
        if n_workers == 1:
            self.collector = Collector(_serial_env(env_factory, batch_B, transform), policy, **kwargs)
        else:
            make = functools.partial(_serial_env, env_factory, batch_B // n_workers, transform)
            self.collector = MultiSyncCollector([make] * n_workers, policy, **kwargs)
        self.collector.set_seed(seed)
        self._iterator = iter(self.collector)
        self._closed = False

    def collect(self) -> TensorDictBase:
        if self._closed:
            raise RuntimeError("collector is shut down")
        batch = next(self._iterator).reshape(self.batch_B, self.batch_T)
        batch.set(("collector", "mask"), torch.ones(self.batch_B, self.batch_T, dtype=torch.bool))
        rewards = batch.get(("next", "reward")).reshape(self.batch_B, self.batch_T).numpy()
        dones = batch.get(("next", "done")).reshape(self.batch_B, self.batch_T).numpy()
        self.traj_infos = sorted_infos(self.tracker.add(rewards, dones))
        self.budget.count()
        return batch

    def update_policy_weights_(self, policy_or_weights: Any = None) -> None:
        """Load given weights into the policy (if any), then let TorchRL push them to its workers."""
        if self.policy is not None and policy_or_weights is not None and policy_or_weights is not self.policy:
            load_weights(self.policy, policy_or_weights)
        self.collector.update_policy_weights_()

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.collector.shutdown()
