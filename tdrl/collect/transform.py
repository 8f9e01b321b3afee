"""TorchRL transforms in tdrl's collector kinds, run where a slice's envs step, batched over the slice.

Every TorchRL ``Transform`` works, in one of two ways chosen by its class:

- **Per-step maps** (``ObservationNorm``, ``VecNorm``, ``RewardScaling``,
  ``RewardClipping``, ``ClipTransform``, ``SignTransform``, or a ``Compose`` of only these) are applied in place to
  the slice's step arrays through their public ``forward``: per step they see ``{"observation": next observation,
  "reward": reward}``, and an env that reset also gets its first observation transformed (with a zero reward,
  dropped). This is the fast path (``benchmarks/collectors.py`` measures it).
- **Anything else** (``StepCounter``, ``RewardSum``, ``CatFrames``, ``InitTracker``, a user's own transform) runs
  through TorchRL's own env protocol: a ``TransformedEnv`` over ``_SliceSource``, an ``EnvBase`` whose step and
  reset hand back what the slice's gymnasium envs just did. The transform's step and reset logic then runs exactly
  as inside a TorchRL env: per-episode state resets with the env, keys it adds (``step_count``,
  ``episode_reward``...) go into the batch, a changed observation shape (``CatFrames``) is what the policy sees, and
  a done it raises (``StepCounter(max_steps=...)``) ends the episode: the gymnasium env is reset then.

The policy, the batch and checkpoints see transformed values; TrajInfos keep the env's raw reward (and the
transformed done). Each slice (each worker) holds its own copy of the transform, so a ``VecNorm`` keeps per-worker
statistics (as TorchRL's ``ParallelEnv`` of transformed envs); its state travels in the slice's state, so a resumed
run continues bitwise.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Composite, Unbounded
from torchrl.envs import (
    ClipTransform,
    Compose,
    EnvBase,
    ObservationNorm,
    RewardClipping,
    RewardScaling,
    SignTransform,
    Transform,
    TransformedEnv,
    VecNorm,
)
from torchrl.envs.utils import step_mdp

from tdrl.envs.make import EnvSpecs

__all__ = ["StepTransform", "is_step_map", "load_statistics", "transformed_step_template"]

OBS, REWARD = "observation", "reward"
FLAGS = ("done", "terminated", "truncated")

_MAP_TRANSFORMS: tuple[type[Transform], ...] = (ObservationNorm, VecNorm, RewardScaling, RewardClipping, ClipTransform,
                                                SignTransform)
"""TorchRL transforms that map one step's observation and reward and keep no per-episode state: applied in place
to the step arrays (the fast path). Every other transform runs through TorchRL's env protocol."""


def is_step_map(transform: Transform) -> bool:
    """Whether ``transform`` is one of :data:`_MAP_TRANSFORMS` (or a ``Compose`` of only those)."""
    if isinstance(transform, Compose):
        return all(is_step_map(t) for t in transform.transforms)
    return type(transform) in _MAP_TRANSFORMS


def _check_transform(transform: Any, example: TensorDictBase) -> None:
    """Raise ``ValueError`` (one line, with the reason) unless ``transform`` maps a ``[n]`` step of ``example``'s
    observation and a reward to the same keys, shapes and dtypes (probed on a copy: its state is untouched)."""
    name = type(transform).__name__
    obs = example.get(OBS)
    step = TensorDict({OBS: obs.clone(), REWARD: torch.zeros(obs.shape[0], 1)}, batch_size=obs.shape[:1])
    try:
        out = copy.deepcopy(transform)(step.clone())
    except Exception as err:
        why = f"{type(err).__name__}: {err}".splitlines()[0]
        raise ValueError(f"transform {name} cannot run on a step's observation and reward ({why})") from None
    for key in (OBS, REWARD):
        got = out.get(key, None)
        if got is None or got.shape != step.get(key).shape or got.dtype != step.get(key).dtype:
            raise ValueError(f"transform {name} must keep {key!r} with its shape and dtype (it gives "
                             f"{None if got is None else (tuple(got.shape), got.dtype)})")


def check_is_transform(transform: Any) -> None:
    if not isinstance(transform, Transform):
        raise ValueError(f"transform= takes a TorchRL Transform (e.g. Compose(VecNorm(in_keys=['observation']))), "
                         f"got {type(transform).__name__}")


class StepTransform:
    """Applies a per-step map (:func:`is_step_map`) in place to rows ``[n]`` of a step TensorDict (``rows``, views
    of the step arrays)."""

    def __init__(self, transform: Transform, rows: TensorDictBase) -> None:
        _check_transform(transform, rows)
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

    def after_step(self, actions: np.ndarray) -> None:
        """Transform the step's next observation and reward, then the observation the policy sees next (the
        env's own done flags stand: returns ``None``)."""
        out = self._apply(self.next_obs.clone(), self.reward.clone())
        self.next_obs.copy_(out.get(OBS))
        self.reward.copy_(out.get(REWARD))
        going = ~self.is_init
        self.obs[going] = self.next_obs[going]
        self.after_reset()

    def finish_batch(self) -> None:
        """Nothing: a map keeps no per-episode state."""

    def episode_state(self) -> None:
        """Nothing: a map keeps no per-episode state."""

    def load_episode_state(self, state: Any) -> None:
        """Nothing: a map keeps no per-episode state."""

    def state_dict(self) -> dict[str, Any]:
        """A copy of the transform's ``state_dict`` (its tensors keep changing in place)."""
        return copy.deepcopy(self.transform.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.transform.load_state_dict(state)


class _SliceSource(EnvBase):
    """A TorchRL env over a slice's step arrays ``raw`` (a ``[n]`` step TensorDict the gymnasium envs wrote): its
    step returns the step they just took, its reset calls ``reset_rows(mask)`` (which resets those gymnasium envs
    and writes their first observations) and returns the observations. Built with ``reset_rows=None`` it only
    describes specs (what a transform makes of them: :func:`transformed_step_template`)."""

    def __init__(self, specs: EnvSpecs, raw: TensorDictBase,
                 reset_rows: Callable[[np.ndarray], None] | None = None) -> None:
        n = int(raw.batch_size[0])
        super().__init__(batch_size=torch.Size([n]))
        obs_spec = specs.observation_spec
        self.observation_spec = Composite({OBS: obs_spec.expand(n, *obs_spec.shape)}, shape=(n,))
        self.action_spec = specs.action_spec.expand(n, *specs.action_spec.shape)
        self.reward_spec = Unbounded((n, 1))
        self.raw, self.reset_rows = raw, reset_rows

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        raw = self.raw.get("next")
        return TensorDict({key: raw.get(key).clone() for key in (OBS, REWARD, *FLAGS)}, batch_size=self.batch_size)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        if mask is not None and self.reset_rows is not None:  # no mask: the first reset, which the slice did
            self.reset_rows(mask.reshape(-1).numpy())
        out = TensorDict({OBS: self.raw.get(OBS).clone()}, batch_size=self.batch_size)
        for flag in FLAGS:
            out.set(flag, torch.zeros(self.batch_size[0], 1, dtype=torch.bool))
        return out

    def _set_seed(self, seed: int | None) -> None:
        """The slice seeds its gymnasium envs itself."""


def transformed_step_template(transform: Transform, specs: EnvSpecs, n: int) -> TensorDict:
    """The zero ``[n]`` step TensorDict a slice running ``transform`` through the env protocol fills: every
    observation key the transformed env has (``observation`` as transformed, and the keys it adds), ``is_init``,
    and under ``next`` those keys with ``reward`` and the done flags."""
    raw = TensorDict({OBS: specs.observation_spec.zero((n,))}, batch_size=[n])
    env = TransformedEnv(_SliceSource(specs, raw), transform.clone())
    root = env.observation_spec.zero().exclude("is_init")
    flags = {flag: torch.zeros(n, 1, dtype=torch.bool) for flag in FLAGS}
    return TensorDict({**root.to_dict(), "is_init": torch.zeros(n, 1, dtype=torch.bool),
                       "next": {**root.clone().to_dict(), REWARD: torch.zeros(n, 1), **flags}}, batch_size=[n])


class _EnvProtocolTransform:
    """Runs ``transform`` through TorchRL's env protocol over a slice: the gymnasium envs write the raw step into
    ``raw``; the transformed step goes into ``rows`` (views of the shared step arrays, laid out by
    :func:`transformed_step_template`); ``reset_rows(mask)`` resets the gymnasium envs the transformed env resets.
    Reset-at-once resets at every done; wait-reset (evaluation) holds the done envs until :meth:`finish_batch`."""

    def __init__(self, transform: Transform, specs: EnvSpecs, raw: TensorDictBase, rows: TensorDictBase,
                 reset_rows: Callable[[np.ndarray], None], *, wait_reset: bool) -> None:
        self.transform = transform
        self.env = TransformedEnv(_SliceSource(specs, raw, reset_rows), transform)
        self.rows, self.wait_reset = rows, wait_reset
        self.root_keys = [k for k in rows.keys(True, True) if k != "is_init" and (not isinstance(k, tuple)
                                                                                 or k[0] != "next")]
        self.root: TensorDictBase = TensorDict(batch_size=rows.batch_size)
        self.is_init = rows.get("is_init")

    def _write_root(self, root: TensorDictBase, is_init: torch.Tensor) -> None:
        self.root = root
        for key in self.root_keys:
            self.rows.get(key).copy_(root.get(key))
        self.is_init.copy_(is_init)

    def after_reset(self) -> None:
        """Reset every env through the transformed env (the slice's envs were just reset: ``reset_rows`` sees
        them all; call this right after the slice's ``start``)."""
        with torch.no_grad():
            root = self.env.reset()
        self._write_root(root, torch.ones_like(self.is_init))

    def after_step(self, actions: np.ndarray) -> np.ndarray:
        """Run the slice's step through the transform; reset the envs it says are done (reset-at-once). Returns
        the transformed done flags ``[n]`` (episode ends for the TrajInfos)."""
        with torch.no_grad():
            out = self.env.step(self.root.set("action", torch.as_tensor(actions)))
            self.rows.get("next").update_(out.get("next").select(*self.rows.get("next").keys(True, True)))
            done = out.get(("next", "done")).clone()
            root = step_mdp(out)
            if not self.wait_reset:
                root = self.env.maybe_reset(root)
        self._write_root(root, done if not self.wait_reset else torch.zeros_like(done))
        return done.reshape(-1).numpy()

    def finish_batch(self) -> None:
        """Wait-reset: reset the envs that finished during the batch."""
        if not self.wait_reset:
            return
        done = self.root.get("done").clone()
        with torch.no_grad():
            root = self.env.maybe_reset(self.root)
        self._write_root(root, done)

    def state_dict(self) -> dict[str, Any]:
        """A copy of the transform's own state (``VecNorm`` statistics, ``CatFrames`` buffers)."""
        return copy.deepcopy(self.transform.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.transform.load_state_dict(state)

    def episode_state(self) -> dict[str, Any]:
        """The transformed values the next step continues from (``step_count``, ``episode_reward``, stacked
        frames) and ``is_init``."""
        return {"root": self.root.clone().to_dict(), "is_init": self.is_init.clone()}

    def load_episode_state(self, state: dict[str, Any]) -> None:
        self._write_root(TensorDict(state["root"], batch_size=self.rows.batch_size), state["is_init"])


def load_statistics(target: Transform, state: dict[str, Any]) -> None:
    """Load into ``target`` (a copy of the transform ``state`` was saved from) the state of its statistics
    transforms (those with ``freeze``, e.g. ``VecNorm``) and freeze them; per-env state (``CatFrames`` buffers) is
    not loaded: the target's envs keep their own."""
    parts = list(target.transforms) if isinstance(target, Compose) else [target]
    for i, part in enumerate(parts):
        if not callable(getattr(part, "freeze", None)):
            continue
        prefix = f"transforms.{i}." if isinstance(target, Compose) else ""
        part.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        part.freeze()


def slice_transform(transform: Transform, specs: EnvSpecs, raw: TensorDictBase | None, rows: TensorDictBase,
                    reset_rows: Callable[[np.ndarray], None], *, wait_reset: bool
                    ) -> StepTransform | _EnvProtocolTransform:
    """The slice's transform runner: the in-place map for :func:`is_step_map` transforms, else the env protocol."""
    if raw is None:
        return StepTransform(transform, rows)
    return _EnvProtocolTransform(transform, specs, raw, rows, reset_rows, wait_reset=wait_reset)
