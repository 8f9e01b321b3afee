"""TorchRL transforms applied batched, once per step, over the envs of a slice.

Where they run: in the process that steps the envs — the main process for the serial collector, **each worker**
for the parallel and action-server collectors (over its ``B/W`` envs). Stateful transforms therefore keep one
state per worker (e.g. ``VecNormV2`` statistics per worker; use ``reduce_batch_dims=True`` so statistics are
per feature, not per env). Each process gets its own copy of the transform.

Per step the transform sees a ``[n]`` TensorDict of the step results (``observation``, ``reward``, ``done``,
``terminated``, ``truncated`` — TorchRL's "next" layout) through ``Transform._step``, and envs that were reset
see their reset observation through ``Transform._reset`` (only those rows). The batch stores the transformed
``observation``/``("next","observation")``/``("next","reward")``; TrajInfo statistics use the env's raw
reward. Transforms that change the observation's dtype or shape (``DoubleToFloat``, ``DTypeCastTransform``,
``UnsqueezeTransform``...) are supported: the output layout is probed once on a copy of the transform.

Supported: stateless transforms and transforms whose state does not depend on the number of envs
(``ObservationNorm``, ``RewardScaling``, ``RewardClipping``, ``SignTransform``, dtype casts,
``VecNormV2(reduce_batch_dims=True)``, ``Compose`` of these). Transforms that keep a buffer per env and expect
TorchRL's ``_reset`` masks (``CatFrames``, ``RewardSum``, ``InitTracker``...) are not: stack frames env-side
(tdrl's Atari envs do), and read episode returns from ``collector.traj_infos``. In wait-reset mode idle envs
keep passing their last observation through the transform until the batch ends (their steps are masked out of
the batch, but a running-statistics transform sees them).
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
    """Calls a TorchRL ``Transform`` on numpy step arrays of ``n`` envs.

    Args:
        transform: a TorchRL ``Transform`` (or ``Compose``) reading ``observation`` and/or ``reward``.
    """

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
        next_td = TensorDict(
            {
                "observation": torch.from_numpy(raw_next_obs),
                "reward": torch.from_numpy(raw_reward).reshape(-1, 1),
                "done": torch.from_numpy(done).reshape(-1, 1),
                "terminated": torch.from_numpy(terminated).reshape(-1, 1),
                "truncated": torch.from_numpy(truncated).reshape(-1, 1),
            },
            n,
        )
        with torch.no_grad():
            out = self.transform._step(TensorDict(batch_size=n), next_td)
        return out.get("observation").numpy(), out.get("reward").reshape(-1).numpy()

    def state_dict(self) -> dict[str, Any]:
        return self.transform.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.transform.load_state_dict(state)
