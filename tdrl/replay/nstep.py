"""n-step return windows, computed at sample time from the stored one-step rewards.

The window of start ``t`` is ``t .. t+k-1`` with ``k = min(n, steps up to and including the first done)``;
``reward_n = sum_{i<k} gamma^i reward[t+i]`` and the bootstrap is discounted by ``gamma ** k``
(``steps_to_next_obs``). Computing it at sample time keeps the stored data exactly what the collector produced.
"""

from __future__ import annotations

import torch

__all__ = ["nstep_returns"]


def nstep_returns(reward: torch.Tensor, done: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted sum over each window, stopping after the first done.

    Args:
        reward: ``[N, n, 1]`` one-step rewards of steps ``t .. t+n-1``.
        done: ``[N, n, 1]`` bool done flags of the same steps.
        gamma: discount.

    Returns:
        ``(reward_n [N, 1] (dtype of reward), steps [N] int64)`` where ``steps`` is the window length ``k``.
    """
    n = reward.shape[1]
    not_done = (~done).to(reward.dtype)
    # alive[:, j] = 1 while no done happened at steps < j
    alive = torch.cat([torch.ones_like(not_done[:, :1]), torch.cumprod(not_done[:, :-1], dim=1)], dim=1)
    discounts = gamma ** torch.arange(n, dtype=reward.dtype).view(1, n, 1)
    reward_n = (reward * alive * discounts).sum(dim=1)
    steps = alive.sum(dim=1).squeeze(-1).to(torch.int64)
    return reward_n, steps
