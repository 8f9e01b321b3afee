"""The ``[B, T]`` batch: allocation once, per-step column writes, per-batch finishing.

Layout (TorchRL's, time last)::

    observation                 [B, T, *obs]     what the policy saw at t
    is_init                     [B, T, 1] bool   observation at t starts an episode
    action, <policy outputs>    [B, T, ...]      e.g. action_log_prob, state_value, action_value, logits
    <recurrent state K>         [B, T, ...]      the state the policy read at t (zeros after is_init)
    next/observation            [B, T, *obs]     observation returned by the step (final one at a done)
    next/reward                 [B, T, 1] float32
    next/done|terminated|truncated  [B, T, 1] bool
    next/<recurrent state K>    [B, T, ...]      the state the policy wrote at t
    collector/traj_ids          [B, T] int64     episode id (unique within the collector), -1 where invalid
    collector/mask              [B, T] bool      False for wait-reset idle steps (their data is zeros)

rlpyt's ``batch_T`` × ``batch_B`` sample buffer is indexed ``[T, B]``; here the same data is ``[B, T]``:
``batch[b, t]`` is rlpyt's ``samples[t, b]``, ``batch_B`` is the first dim and ``batch_T`` the second.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from tdrl.utils.keys import MASK_KEY, TRAJ_KEY

__all__ = ["ColumnWriter", "PolicyWriter", "allocate_batch", "finish_slice"]



def allocate_batch(batch_B: int, batch_T: int, step_template: TensorDictBase,
        policy_template: TensorDictBase) -> TensorDict:
    """Zeros ``[batch_B, batch_T]`` TensorDict with the keys of the step and policy templates (``[B]``). A nested
    TensorDict of the step template with more batch dims (an agent group's ``[B, n_agents]``) gets them after
    ``[B, T]`` (``[B, T, n_agents]``, TorchRL's multi-agent layout)."""
    batch = TensorDict(batch_size=[batch_B, batch_T])
    for template in (step_template, policy_template):
        for key, value in template.items(True, True):
            batch.set(key, torch.zeros((batch_B, batch_T, *value.shape[1:]), dtype=value.dtype))
    for key, value in step_template.items(True):
        if isinstance(value, TensorDictBase) and value.batch_dims > 1:
            batch.get(key).batch_size = (batch_B, batch_T, *value.batch_size[1:])
    batch.set(MASK_KEY, torch.ones(batch_B, batch_T, dtype=torch.bool))
    batch.set(TRAJ_KEY, torch.zeros(batch_B, batch_T, dtype=torch.int64))
    return batch


class ColumnWriter:
    """Copies the ``keys`` of the ``[B]`` ``source`` into column ``t`` of rows ``lo:hi`` of the batch.

    Through numpy views built once (``source``'s tensors are never replaced): a strided numpy copy is several
    times cheaper than ``tensor[:, t].copy_``.
    """

    def __init__(self, batch: TensorDictBase, keys: list[NestedKey], source: TensorDictBase, lo: int, hi: int) -> None:
        self.pairs = [(batch.get(k).numpy()[lo:hi], source.get(k).numpy()[lo:hi]) for k in keys]

    def __call__(self, t: int) -> None:
        for dst, src in self.pairs:
            dst[:, t] = src


class PolicyWriter:
    """Writes policy outputs (a dict of ``[n, ...]`` tensors) into column ``t`` of batch rows ``lo:hi``."""

    def __init__(self, batch: TensorDictBase, keys: list[NestedKey], lo: int, hi: int) -> None:
        self.pairs = [(key, batch.get(key).numpy()[lo:hi]) for key in keys]

    def __call__(self, t: int, out: dict[NestedKey, torch.Tensor]) -> None:
        for key, dst in self.pairs:
            dst[:, t] = out[key].cpu().numpy()


def finish_slice(batch: TensorDictBase, lo: int, hi: int, valid: np.ndarray, traj_ids: np.ndarray,
        wait_reset: bool) -> None:
    """Write ``collector`` keys for rows ``lo:hi`` and zero wait-reset idle steps (rlpyt records zeros)."""
    mask_np = batch.get(MASK_KEY).numpy()
    traj_np = batch.get(TRAJ_KEY).numpy()
    if not wait_reset:
        traj_np[lo:hi] = traj_ids
        return
    mask_np[lo:hi] = valid
    traj_np[lo:hi] = np.where(valid, traj_ids, -1)
    invalid = ~valid
    if not invalid.any():
        return
    for key, value in batch.items(True, True):
        if key in (MASK_KEY, TRAJ_KEY):
            continue
        arr = value.numpy()[lo:hi]
        arr[invalid] = 0
