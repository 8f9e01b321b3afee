"""TorchRL transforms in tdrl's collector kinds, applied batched to a slice's step arrays where its envs step.

Supported: transforms that act on one step's entries through their public ``forward`` (TensorDict in, the same
keys and shapes out): observation and reward transforms such as ``ObservationNorm``, ``VecNorm``,
``RewardScaling``, ``ClipTransform`` and a ``Compose`` of them. Transforms that need an env's step/reset protocol
or a time dimension (``StepCounter``, ``CatFrames``, ``RewardSum``, ``InitTracker``) fail at build with the
reason: run them in the ``torchrl`` kind, or as a gymnasium wrapper in the env factory.

Per step the transform sees ``{"observation": next observation, "reward": reward}`` of the slice's envs; an env
that reset also gets its first observation transformed (with a zero reward, dropped). The policy, the batch and
checkpoints see transformed values; TrajInfos keep the env's raw reward. Each slice (each worker) holds its own
copy of the transform, so a ``VecNorm`` keeps per-worker statistics (as TorchRL's ``ParallelEnv`` of transformed
envs); its ``state_dict`` travels in the slice's state, so a resumed run continues bitwise.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.envs import Transform

__all__ = ["StepTransform", "check_transform"]

OBS, REWARD = "observation", "reward"


def check_transform(transform: Any, example: TensorDictBase) -> None:
    """Raise ``ValueError`` (one line, with the reason) unless ``transform`` maps a ``[n]`` step of ``example``'s
    observation and a reward to the same keys, shapes and dtypes (probed on a copy: its state is untouched)."""
    name = type(transform).__name__
    if not isinstance(transform, Transform):
        raise ValueError(f"transform= takes a TorchRL Transform (e.g. Compose(VecNorm(in_keys=['observation']))), "
                         f"got {name}")
    obs = example.get(OBS)
    step = TensorDict({OBS: obs.clone(), REWARD: torch.zeros(obs.shape[0], 1)}, batch_size=obs.shape[:1])
    try:
        out = copy.deepcopy(transform)(step.clone())
    except Exception as err:
        why = f"{type(err).__name__}: {err}".splitlines()[0]
        raise ValueError(f"transform {name} cannot run batched on a step's observation and reward in tdrl's "
                         f"collectors ({why}); use kind='torchrl' or a gymnasium wrapper") from None
    for key in (OBS, REWARD):
        got = out.get(key, None)
        if got is None or got.shape != step.get(key).shape or got.dtype != step.get(key).dtype:
            raise ValueError(f"transform {name} must keep {key!r} with its shape and dtype in tdrl's collectors (it "
                             f"gives {None if got is None else (tuple(got.shape), got.dtype)}); use kind='torchrl'")


class StepTransform:
    """Applies ``transform`` in place to rows ``[n]`` of a step TensorDict (``rows``, views of the step arrays)."""

    def __init__(self, transform: Transform, rows: TensorDictBase) -> None:
        check_transform(transform, rows)
        self.transform = transform
        self.obs, self.is_init = rows.get(OBS), rows.get("is_init")[:, 0]
        self.next_obs, self.reward = rows.get(("next", OBS)), rows.get(("next", REWARD))

    def _apply(self, obs: torch.Tensor, reward: torch.Tensor) -> TensorDictBase:
        with torch.no_grad():
            return self.transform(TensorDict({OBS: obs, REWARD: reward}, batch_size=obs.shape[:1]))

    def after_reset(self) -> None:
        """Transform the first observation of every env that just reset (``is_init``)."""
        init = self.is_init
        if bool(init.any()):
            first = self.obs[init]
            self.obs[init] = self._apply(first, torch.zeros(first.shape[0], 1)).get(OBS)

    def after_step(self) -> None:
        """Transform the step's next observation and reward, then the observation the policy sees next."""
        out = self._apply(self.next_obs.clone(), self.reward.clone())
        self.next_obs.copy_(out.get(OBS))
        self.reward.copy_(out.get(REWARD))
        going = ~self.is_init
        self.obs[going] = self.next_obs[going]
        self.after_reset()

    def state_dict(self) -> dict[str, Any]:
        """A copy of the transform's ``state_dict`` (its tensors keep changing in place)."""
        return copy.deepcopy(self.transform.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.transform.load_state_dict(state)
