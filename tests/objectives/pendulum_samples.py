"""Shared by the fused continuous-loss tests: a tiny Pendulum replay sample, TorchRL critic parameters copied
into a TwinQ stack (so tdrl's and TorchRL's losses see the same critics), and the time-limit bootstrap check."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase


def pendulum_batch(n: int = 6) -> TensorDict:
    """Six transitions with a terminal, a time limit, n-step counts and PER weights."""
    torch.manual_seed(1)
    return TensorDict(
        {
            "observation": torch.randn(n, 3),
            "action": torch.rand(n, 1) * 4 - 2,
            ("next", "observation"): torch.randn(n, 3),
            ("next", "reward"): -torch.rand(n, 1) * 5,
            ("next", "terminated"): torch.tensor([[False], [True], [False], [False], [False], [True]]),
            ("next", "truncated"): torch.tensor([[False], [False], [True], [False], [False], [False]]),
            ("next", "done"): torch.tensor([[False], [True], [True], [False], [False], [True]]),
            "steps_to_next_obs": torch.tensor([[1], [1], [1], [3], [2], [1]]),
            "priority_weight": torch.tensor([1.0, 0.5, 0.25, 0.8, 0.3, 0.9]),
        },
        batch_size=[n],
    )


@torch.no_grad()
def copy_critics_into_twin(src: TensorDictBase, dst: torch.nn.Module, stacked: bool = True) -> None:
    """Copy ``make_q_critic`` parameters as TorchRL holds them (``stacked``: one set per critic, as TD3Loss and
    SACLoss expand them; else a single set, as DDPGLoss) into a ``TwinQ``'s ``weights``/``biases``."""
    for j, layer in enumerate(("0", "2", "4")):
        weight, bias = src["module", "net", layer, "weight"], src["module", "net", layer, "bias"]
        if not stacked:
            weight, bias = weight[None], bias[None]
        dst.weights[j].copy_(weight.transpose(-1, -2))
        dst.biases[j].copy_(bias[:, None, :])


def assert_time_limits_bootstrap(q_loss: Callable[[TensorDict], torch.Tensor], batch: TensorDict) -> None:
    """``q_loss`` (a critic loss under a fixed seed) ignores a transition becoming truncated (the target still
    bootstraps) and changes when it becomes terminated."""
    base = q_loss(batch.clone())
    truncated_only = batch.clone()
    truncated_only["next", "truncated"][0] = True
    truncated_only["next", "done"][0] = True
    assert torch.allclose(base, q_loss(truncated_only))
    terminated = batch.clone()
    terminated["next", "terminated"][0] = True
    assert not torch.allclose(base, q_loss(terminated))
