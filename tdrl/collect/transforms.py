"""TorchRL transforms applied batched, once per step, over the envs of a slice.

A transform runs where the envs are stepped: in the main process for the serial collector, in each worker
otherwise, so a stateful transform keeps one state per process (``VecNormV2`` needs ``reduce_batch_dims=True`` so
its statistics are per feature, not per env). It sees the step results (TorchRL's "next" layout) and the reset
observations of the envs that were reset; the batch stores the transformed observations and reward, TrajInfos
the env's raw reward. Transforms may change the observation's dtype or shape (probed once on a copy).

Supported: stateless transforms and those whose state does not depend on the number of envs (``ObservationNorm``,
``RewardScaling``, ``RewardClipping``, ``SignTransform``, dtype casts, ``VecNormV2(reduce_batch_dims=True)``,
``Compose`` of these). Per-env buffers driven by ``_reset`` masks (``CatFrames``, ``RewardSum``, ``InitTracker``)
are not: stack frames env-side and read returns from ``collector.traj_infos``. In wait-reset mode idle envs keep
passing their last observation through the transform until the batch ends.

TorchRL has no public per-step entry point (``forward`` skips ``_step``/``_reset``, where stateful transforms
update), so this module calls ``Transform._step`` and ``Transform._reset`` as ``TransformedEnv`` does.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["StepTransform", "probe_observation"]


def probe_observation(transform: Any, raw_obs: torch.Tensor) -> torch.Tensor:
    """Transformed version of ``raw_obs`` ``[n, ...]`` computed on a deep copy (state untouched)."""
    n = raw_obs.shape[:1]
    try:
        probe = copy.deepcopy(transform)
        out = probe._reset(TensorDict(batch_size=n), TensorDict({"observation": raw_obs.clone()}, n))
    except Exception as err:
        raise TypeError(
            f"transform {type(transform).__name__} cannot be applied by tdrl's collectors (it must be deep-copyable "
            "and transform a batch of reset observations); see tdrl.collect.transforms for the supported kinds"
        ) from err
    return out.get("observation")


class StepTransform:
    """Calls a TorchRL ``Transform`` (or ``Compose``) reading ``observation`` and/or ``reward`` on numpy step
    arrays of ``n`` envs."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def reset(self, raw_obs: np.ndarray) -> np.ndarray:
        """Transformed reset observations (``[k, ...]`` raw → ``[k, ...]``)."""
        obs = torch.from_numpy(np.ascontiguousarray(raw_obs))
        n = obs.shape[:1]
        with torch.no_grad():
            out = self.transform._reset(TensorDict(batch_size=n), TensorDict({"observation": obs}, n))
        return out.get("observation").numpy()

    def step(self, raw_next_obs: np.ndarray, raw_reward: np.ndarray, done: np.ndarray, terminated: np.ndarray,
            truncated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Transformed ``(next_observation [n, ...], reward [n])`` of one step."""
        n = torch.Size([raw_next_obs.shape[0]])
        flags = {"reward": raw_reward, "done": done, "terminated": terminated, "truncated": truncated}
        next_td = TensorDict({"observation": torch.from_numpy(raw_next_obs),
                              **{k: torch.from_numpy(v).reshape(-1, 1) for k, v in flags.items()}}, n)
        with torch.no_grad():
            out = self.transform._step(TensorDict(batch_size=n), next_td)
        return out.get("observation").numpy(), out.get("reward").reshape(-1).numpy()

    def state_dict(self) -> dict[str, Any]:
        return self.transform.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.transform.load_state_dict(state)
