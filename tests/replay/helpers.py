"""Synthetic collector batches with hand-checkable contents for the replay tests."""

from __future__ import annotations

import torch
from tensordict import TensorDict


def make_stream(B: int, T: int, seed: int = 0, done_prob: float = 0.1, trunc_frac: float = 0.5,
                obs_dim: int = 3) -> TensorDict:
    """A [B, T] collector batch: obs/next obs encode (stream, time), random rewards, random terminations and
    truncations (about ``trunc_frac`` of the dones are truncations)."""
    g = torch.Generator().manual_seed(seed)
    time = torch.arange(T, dtype=torch.float32).expand(B, T)
    stream = torch.arange(B, dtype=torch.float32).unsqueeze(1).expand(B, T)
    code = stream * 10_000 + time
    done = torch.rand(B, T, 1, generator=g) < done_prob
    trunc = done & (torch.rand(B, T, 1, generator=g) < trunc_frac)
    term = done & ~trunc
    return TensorDict(
        {
            "observation": code.unsqueeze(-1).repeat(1, 1, obs_dim),
            "action": torch.randn(B, T, 2, generator=g),
            "sample_log_prob": torch.randn(B, T, generator=g),
            "next": {
                # the next observation is unique per step (offset 0.5), so a test can tell which step it came from
                "observation": (code + 0.5).unsqueeze(-1).repeat(1, 1, obs_dim),
                "reward": torch.randn(B, T, 1, generator=g),
                "done": done,
                "terminated": term,
                "truncated": trunc,
            },
        },
        batch_size=[B, T],
    )


def reference_nstep(stream: TensorDict, b: int, t: int, n: int, gamma: float) -> dict:
    """Loop-by-hand n-step target for start (b, t) of a [B, T] stream."""
    ret, k = 0.0, 0
    for i in range(n):
        ret += gamma**i * float(stream["next", "reward"][b, t + i, 0])
        k = i + 1
        if bool(stream["next", "done"][b, t + i, 0]):
            break
    last = t + k - 1
    return {
        "reward": ret,
        "k": k,
        "next_obs": float(stream["next", "observation"][b, last, 0]),
        "terminated": bool(stream["next", "terminated"][b, last, 0]),
        "truncated": bool(stream["next", "truncated"][b, last, 0]),
        "done": bool(stream["next", "done"][b, last, 0]),
    }
