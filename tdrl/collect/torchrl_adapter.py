"""TorchRL's own collectors behind tdrl's collector interface (``make_collector("torchrl", ...)``).

A reference, and the way to TorchRL features (transforms with per-env state such as ``CatFrames``/``RewardSum``,
its weight-sync schemes). ``n_workers == 1`` wraps ``Collector(SerialEnv(batch_B))``, more wrap
``MultiSyncCollector`` over ``n_workers`` × ``SerialEnv(batch_B / n_workers)``. Batches are reshaped to
``[batch_B, batch_T]`` with an all-True ``("collector", "mask")``; float64 observations become float32, discrete
actions are indices. TrajInfos come from each batch's reward and done flags (after ``transform``; ``info``'s
``traj_done`` is not read, so with Atari's episodic lives they end at each lost life). Only reset-at-once, no
decorrelation steps and feed-forward policies (tdrl's recurrent policies read ``is_init`` and a recurrent state no
TorchRL env provides). Its ``state_dict`` holds no env state (warned at build).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.common import env_specs, sorted_infos
from tdrl.collect.layout import group_keys
from tdrl.collect.runner import SliceSettings, is_composite
from tdrl.collect.traj_info import EpisodeTracker
from tdrl.utils.errors import UserError
from tdrl.utils.keys import INIT_KEY, RECURRENT_KEYS

__all__ = ["NOT_CAPTURED", "TorchRLEngine"]

NOT_CAPTURED = ("collector kind 'torchrl' does not checkpoint its envs or episodes in progress: a resumed run restarts "
                "them (the tdrl kinds resume exactly)")


def _gym_env(env_factory: Callable[..., Any], transform: Any) -> Any:
    from torchrl.envs import Compose, DoubleToFloat, GymWrapper, TransformedEnv

    env = GymWrapper(env_factory(), categorical_action_encoding=True)
    transforms = []
    if any(spec.dtype == torch.float64 for spec in env.observation_spec.values(True, True)):
        transforms.append(DoubleToFloat())
    if transform is not None:
        transforms.append(transform.clone())  # one per env: a transform belongs to one env (TorchRL's rule)
    return TransformedEnv(env, Compose(*transforms)) if transforms else env


def _serial_env(env_factory: Callable[..., Any], n: int, transform: Any) -> Any:
    from torchrl.envs import SerialEnv

    return SerialEnv(n, functools.partial(_gym_env, env_factory, transform))


def _check_env(env_factory: Callable[..., Any], transform: Any) -> None:
    """Build one transformed env here and step it, so a transform or env that fails raises at construction, in
    this process, instead of inside TorchRL's worker processes."""
    env = _gym_env(env_factory, transform)
    try:
        env.rand_step(env.reset())
    except Exception as err:
        why = f"{type(err).__name__}: {err}".splitlines()[0]
        raise ValueError(f"collector kind 'torchrl' cannot step this env with transform "
                         f"{type(transform).__name__} ({why})") from err
    finally:
        env.close()


class TorchRLEngine:
    """A TorchRL collector producing tdrl-layout batches and their TrajInfos (``settings.transform``, any TorchRL
    transform, is appended to each env)."""

    def __init__(self, settings: SliceSettings, policy: TensorDictModuleBase | None, *, batch_B: int, batch_T: int,
            n_workers: int = 2, exploration: InteractionType = InteractionType.RANDOM,
            device: torch.device | str | None = None) -> None:
        from torchrl.collectors import Collector, MultiSyncCollector

        if settings.wait_reset:
            raise UserError("reset_mode='wait_reset' is not available with TorchRL's collectors; use a tdrl kind "
                            "(collector.kind=serial, parallel, action_server or alternating)")
        if settings.max_decorrelation_steps:
            raise UserError("max_decorrelation_steps is not available with TorchRL's collectors; use a tdrl kind")
        reads = {key if isinstance(key, str) else tuple(key) for key in getattr(policy, "in_keys", ())}
        if INIT_KEY in reads or reads & set(RECURRENT_KEYS):
            raise UserError("collector kind 'torchrl' steps feed-forward policies only (this one is recurrent: it "
                            "reads is_init and its recurrent state); use a tdrl kind (collector.kind=serial, "
                            "parallel, action_server or alternating)")
        specs = env_specs(settings.env_factory)
        if is_composite(specs) and group_keys(specs.observation_spec.zero((1,))):
            raise UserError("collector kind 'torchrl' does not step tdrl's multi-agent envs (agent groups); use a "
                            "tdrl kind (collector.kind=serial, parallel, action_server or alternating)")
        self.batch_B, self.batch_T, self.policy = batch_B, batch_T, policy
        self.tracker = EpisodeTracker(batch_B, discount=settings.discount, game_score=settings.game_score)
        kwargs = dict(
            frames_per_batch=batch_B * batch_T,
            total_frames=-1,
            exploration_type=exploration,
            device=device,
            auto_register_policy_transforms=False,  # the env is built as given; no implicit InitTracker
        )
        make = functools.partial(_serial_env, settings.env_factory, batch_B // n_workers, settings.transform)
        _check_env(settings.env_factory, settings.transform)
        if n_workers == 1:
            self.collector = Collector(make(), policy, **kwargs)
        else:
            self.collector = MultiSyncCollector([make] * n_workers, policy, **kwargs)
        self.collector.set_seed(settings.seed)
        self.batches = iter(self.collector)
        warnings.warn(NOT_CAPTURED, stacklevel=3)

    def state_dict(self) -> dict[str, Any]:
        return {"captured": False, "reason": NOT_CAPTURED}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see :data:`NOT_CAPTURED`)."""

    def run(self, exploration: InteractionType) -> tuple[TensorDictBase, list[dict[str, float]]]:
        """One batch with the policy's current weights (TorchRL fixes the exploration type when it is built)."""
        if self.policy is not None:  # random actions (policy=None) have no weights
            self.collector.update_policy_weights_()
        batch = next(self.batches).reshape(self.batch_B, self.batch_T)
        batch.set(("collector", "mask"), torch.ones(self.batch_B, self.batch_T, dtype=torch.bool))
        rewards = batch.get(("next", "reward")).reshape(self.batch_B, self.batch_T).numpy()
        dones = batch.get(("next", "done")).reshape(self.batch_B, self.batch_T).numpy()
        return batch, sorted_infos(self.tracker.add(rewards, dones))

    def shutdown(self) -> None:
        self.collector.shutdown()
