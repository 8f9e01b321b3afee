"""Synthetic collector batches with hand-checkable contents for the replay tests."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

F = 4  # Atari frame stack depth


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


def atari_episodes(B: int, T: int, seed: int, padding: str, mean_len: int = 12):
    """Synthetic Atari-like [B, T] batch with env-style stacks (zero- or reset-padded at episode starts)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(B, T + 1, 84, 84), dtype=np.uint8)  # frame t+1 = newest of next obs
    done = rng.random((B, T)) < 1.0 / mean_len
    obs = np.zeros((B, T, F, 84, 84), dtype=np.uint8)
    next_obs = np.zeros_like(obs)
    reset_frames = rng.integers(0, 256, size=(B, T, 84, 84), dtype=np.uint8)
    for b in range(B):
        stack = None
        for t in range(T):
            if stack is None:  # episode start: the env's reset frame
                first = reset_frames[b, t]
                pad = np.zeros((F - 1, 84, 84), np.uint8) if padding == "zero" else np.repeat(first[None], F - 1, 0)
                stack = np.concatenate([pad, first[None]])
            obs[b, t] = stack
            stack = np.concatenate([stack[1:], frames[b, t + 1][None]])
            next_obs[b, t] = stack
            if done[b, t]:
                stack = None
    is_init = np.zeros((B, T, 1), dtype=bool)
    is_init[:, 0] = True
    is_init[:, 1:, 0] = done[:, :-1]
    term = done & (rng.random((B, T)) < 0.5)
    time = np.broadcast_to(np.arange(T), (B, T))
    return TensorDict({
        "observation": torch.from_numpy(obs), "is_init": torch.from_numpy(is_init),
        "action": torch.from_numpy(time.copy()),
        "next": {"observation": torch.from_numpy(next_obs), "reward": torch.zeros(B, T, 1),
                 "done": torch.from_numpy(done[..., None]), "terminated": torch.from_numpy(term[..., None]),
                 "truncated": torch.from_numpy((done & ~term)[..., None])},
    }, batch_size=[B, T])
