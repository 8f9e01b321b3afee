"""n-step returns and R2D1's sequence priority: the arithmetic replay (at sample time) and the losses (R2D1, Ape-X's
actor priorities) share, in the one layer both may import."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["nstep_returns", "nstep_windows", "sequence_priority"]


def nstep_returns(reward: torch.Tensor, done: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """n-step returns of windows ``[N, n, 1]`` of one-step rewards and done flags, stopping after the first done.

    The window of start ``t`` is ``t .. t+k-1`` with ``k = min(n, steps up to and including the first done)``;
    returns ``(sum_{i<k} gamma^i reward[t+i] [N, 1], k [N] int64)``, and the target bootstraps with ``gamma ** k``.
    """
    n = reward.shape[1]
    not_done = (~done).to(reward.dtype)
    # alive[:, j] = 1 while no done happened at steps < j
    alive = torch.cat([torch.ones_like(not_done[:, :1]), torch.cumprod(not_done[:, :-1], dim=1)], dim=1)
    # a sum term by term, each discount a Python float: the same roundings on every device (a CUDA reduction and
    # pow kernel round differently from the CPU's, and replay samples gathered on a GPU equal the host's bit for bit)
    live = reward * alive
    reward_n = live[:, 0]
    for i in range(1, n):
        reward_n = reward_n + live[:, i] * gamma**i
    steps = alive.sum(dim=1).squeeze(-1).to(torch.int64)
    return reward_n, steps


def nstep_windows(reward: torch.Tensor, done: torch.Tensor, n: int, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nstep_returns` for every start ``t`` of ``[B, T]`` rows, windows ending at the row's end: returns
    ``(return [B, T], k [B, T])``, the window of ``t`` being ``t .. t+k-1``."""
    B, T = reward.shape
    done = done.clone()
    done[:, -1] = True  # a window never runs past the row
    reward = F.pad(reward, (0, n - 1)).unfold(1, n, 1).reshape(B * T, n, 1)
    done = F.pad(done, (0, n - 1), value=True).unfold(1, n, 1).reshape(B * T, n, 1)
    ret, k = nstep_returns(reward, done, gamma)
    return ret.reshape(B, T), k.reshape(B, T)


def sequence_priority(td_error: torch.Tensor, eta: float = 0.9, valid: torch.Tensor | None = None) -> torch.Tensor:
    """R2D1's sequence priority ``eta * max_t |td| + (1 - eta) * mean_t |td|`` of each row of ``[N, T]``; with a
    ``valid`` mask, over the valid steps only (0 for a row without any)."""
    abs_td = td_error.detach().abs().reshape(td_error.shape[0], -1)
    if valid is None:
        return eta * abs_td.max(dim=1).values + (1.0 - eta) * abs_td.mean(dim=1)
    masked = abs_td * valid
    mean = masked.sum(1) / valid.sum(1).clamp(min=1)
    return eta * masked.max(1).values + (1 - eta) * mean
