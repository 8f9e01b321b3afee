"""Per-episode statistics (rlpyt's TrajInfo), tracked per env and vectorised per batch.

A collector reports one plain ``dict`` per finished episode, ``{"Length", "Return", "NonzeroRewards",
"DiscountedReturn"}`` (plus ``"GameScore"`` on Atari), computed from the **env's own reward** (before any collector
transform), so ``Return`` is the score a paper would report. An env that reports ``info["traj_done"]`` (Atari with
episodic lives) ends a TrajInfo at game over, not at each lost life (see :mod:`tdrl.collect.stepping`), so
``Return`` and ``GameScore`` are the game's. Fields starting with ``_`` are never logged (rlpyt's convention).
Episodes carry their partial sums across batches; decorrelation steps count toward each env's first episode, but
episodes that *finish* during decorrelation are dropped.

A multi-agent env's TrajInfos also hold each agent group's return, ``"<group>/Return"`` (the sum over the group's
agents of ``("next", group, "reward")``; the groups' returns add up to ``Return``), which the logs write as
``train/<group>/return_mean``... beside the summed ``train/return_mean``. A collector that steps grouped envs
builds its tracker with ``groups=`` (:func:`group_name` of each :func:`~tdrl.collect.layout.group_keys`) and hands
each block's :func:`group_rewards` to :meth:`EpisodeTracker.add`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

__all__ = ["EpisodeTracker", "group_name", "group_rewards"]

#: Blocks of at most this many env steps are folded step by step (see ``EpisodeTracker._add_stepwise``).
SMALL_BLOCK = 32


class EpisodeTracker:
    """Running episode sums for ``n_envs`` envs, updated from ``[n_envs, k]`` blocks of rewards and dones.

    Reading whole blocks once per batch (prefix sums) keeps per-step Python work out of the hot loop.

    Args:
        n_envs: number of envs tracked (a worker's slice).
        discount: discount of ``DiscountedReturn``.
        game_score: add ``GameScore`` (Atari).
        groups: agent groups whose returns each TrajInfo adds as ``"<group>/Return"`` (their rewards go to
            :meth:`add`).
    """

    def __init__(self, n_envs: int, discount: float = 0.99, game_score: bool = False,
                 groups: Sequence[str] = ()) -> None:
        self.n_envs = n_envs
        self.discount = float(discount)
        self.game_score = game_score
        self._ret = np.zeros(n_envs, np.float64)
        self._disc_ret = np.zeros(n_envs, np.float64)
        self._disc_pow = np.ones(n_envs, np.float64)
        self._len = np.zeros(n_envs, np.int64)
        self._nonzero = np.zeros(n_envs, np.int64)
        self._pows = np.ones(1, np.float64)
        # each group's episodes, tracked as the whole episode's (same dones, so the same episodes in the same order)
        self._groups = {group: EpisodeTracker(n_envs, discount) for group in groups}

    def state_dict(self) -> dict[str, Any]:
        """The running sums of the episodes in progress (copies), each group's under ``groups``."""
        state: dict[str, Any] = {"return": self._ret.copy(), "discounted_return": self._disc_ret.copy(),
                 "discount_power": self._disc_pow.copy(), "length": self._len.copy(), "nonzero": self._nonzero.copy()}
        if self._groups:
            state["groups"] = {group: tracker.state_dict() for group, tracker in self._groups.items()}
        return state

    def load_state_dict(self, state: dict[str, Any], rows: np.ndarray | None = None) -> None:
        """Restore the running sums (of the envs selected by the bool mask ``rows`` only, when given)."""
        rows = np.ones(self.n_envs, bool) if rows is None else rows
        for group, tracker in self._groups.items():
            if group in state.get("groups", {}):  # absent in checkpoints from before groups were tracked
                tracker.load_state_dict(state["groups"][group], rows)
        sums = (self._ret, self._disc_ret, self._disc_pow, self._len, self._nonzero)
        for dst, key in zip(sums, ("return", "discounted_return", "discount_power", "length", "nonzero"), strict=True):
            value = np.asarray(state[key])
            if value.shape != dst.shape:
                raise ValueError(f"episode sums {key!r} have shape {value.shape}, this collector's {dst.shape}")
            dst[rows] = value[rows]

    def _powers(self, n: int) -> np.ndarray:
        if len(self._pows) < n:
            self._pows = self.discount ** np.arange(max(n, 2 * len(self._pows)), dtype=np.float64)
        return self._pows[:n]

    def add(self, rewards: np.ndarray, dones: np.ndarray, valid: np.ndarray | None = None, keep: bool = True,
            group_rewards: Mapping[str, np.ndarray] | None = None) -> list[tuple[int, int, dict[str, float]]]:
        """Fold a block of steps into the running sums.

        Args:
            rewards: ``[n_envs, k]`` raw env rewards.
            dones: ``[n_envs, k]`` episode ends (terminated or truncated; game ends where the env says
                ``traj_done``).
            valid: optional ``[n_envs, k]`` mask; invalid steps (wait-reset idling) are skipped.
            keep: False drops finished episodes (decorrelation) instead of returning them.
            group_rewards: ``{group: [n_envs, k]}`` for every group of ``groups=`` (:func:`group_rewards`).

        Returns:
            ``(step_in_block, env_index, traj_info)`` per finished episode (to order several workers' episodes).
        """
        out = self._add(rewards, dones, valid, keep)
        if self._groups:
            if group_rewards is None or set(group_rewards) != set(self._groups):
                raise ValueError(f"this tracker's groups are {list(self._groups)}; add() got rewards for "
                                 f"{None if group_rewards is None else list(group_rewards)}")
            for group, tracker in self._groups.items():
                parts = tracker._add(group_rewards[group], dones, valid, keep)
                for (_, _, info), (_, _, part) in zip(out, parts, strict=True):
                    info[f"{group}/Return"] = part["Return"]
        return out

    def _add(self, rewards: np.ndarray, dones: np.ndarray, valid: np.ndarray | None,
             keep: bool) -> list[tuple[int, int, dict[str, float]]]:
        rewards = np.asarray(rewards, dtype=np.float64)
        dones = np.asarray(dones, dtype=bool)
        n, k = rewards.shape
        if n * k <= SMALL_BLOCK:
            return self._add_stepwise(rewards, dones, valid, keep)
        # Discounted segment sums below divide prefix sums by discount**t; keep discount**t >= 1e-4 so the
        # subtraction loses at most ~4 digits (split longer blocks, e.g. discount 0.99 -> 916 steps).
        safe = (max(1, int(4 / -np.log10(self.discount))) if self.discount > 0 else 1) if self.discount < 1 else k
        if k > safe:
            out = []
            for lo in range(0, k, safe):
                part = self._add(rewards[:, lo : lo + safe], dones[:, lo : lo + safe],
                                None if valid is None else valid[:, lo : lo + safe], keep)
                out += [(t + lo, i, info) for t, i, info in part]
            return out
        if valid is not None:
            rewards = np.where(valid, rewards, 0.0)
            dones = dones & valid
            stops = valid.sum(1)  # valid steps form a prefix of each row (wait-reset)
        else:
            stops = np.full(n, k)
        pows = self._powers(k + 1)
        # Prefix sums (leading zero column): any segment's sums are two lookups.
        c_ret = np.zeros((n, k + 1))
        np.cumsum(rewards, 1, out=c_ret[:, 1:])
        c_disc = np.zeros((n, k + 1))
        np.cumsum(rewards * pows[:k], 1, out=c_disc[:, 1:])
        c_nz = np.zeros((n, k + 1), np.int64)
        np.cumsum(rewards != 0, 1, out=c_nz[:, 1:])
        rows, ends = np.nonzero(dones)  # row-major: episodes of each env in time order
        first = np.ones(len(rows), bool)
        first[1:] = rows[1:] != rows[:-1]
        starts = np.where(first, 0, np.concatenate([[0], ends[:-1] + 1]))
        stop = ends + 1
        length = stop - starts + np.where(first, self._len[rows], 0)
        ret = c_ret[rows, stop] - c_ret[rows, starts] + np.where(first, self._ret[rows], 0.0)
        nonzero = c_nz[rows, stop] - c_nz[rows, starts] + np.where(first, self._nonzero[rows], 0)
        seg_disc = (c_disc[rows, stop] - c_disc[rows, starts]) / pows[starts]
        disc = np.where(first, self._disc_ret[rows] + self._disc_pow[rows] * seg_disc, seg_disc)
        # Steps after each env's last episode end carry over to the next block.
        tail = np.zeros(n, np.int64)
        last = np.ones(len(rows), bool)
        last[:-1] = rows[1:] != rows[:-1]
        tail[rows[last]] = ends[last] + 1
        ended = np.zeros(n, bool)
        ended[rows] = True
        self._ret[ended] = self._disc_ret[ended] = 0.0
        self._disc_pow[ended] = 1.0
        self._len[ended] = self._nonzero[ended] = 0
        idx = np.arange(n)
        tail_stop = np.maximum(stops, tail)
        tail_len = tail_stop - tail
        self._ret += c_ret[idx, tail_stop] - c_ret[idx, tail]
        tail_sum = c_disc[idx, tail_stop] - c_disc[idx, tail]
        tail_disc = np.divide(tail_sum, pows[tail], out=np.zeros(n), where=tail_len > 0)
        self._disc_ret += self._disc_pow * tail_disc
        self._disc_pow *= pows[tail_len]
        self._len += tail_len
        self._nonzero += c_nz[idx, tail_stop] - c_nz[idx, tail]
        if not keep:
            return []
        columns = (ends, rows, length, ret, nonzero, disc)
        return [(t, i, self._info(*fields)) for t, i, *fields in zip(*(c.tolist() for c in columns), strict=True)]

    def _info(self, length: int, ret: float, nonzero: int, disc: float) -> dict[str, float]:
        info = {"Length": length, "Return": ret, "NonzeroRewards": nonzero, "DiscountedReturn": disc}
        if self.game_score:
            info["GameScore"] = ret
        return info

    def _add_stepwise(self, rewards: np.ndarray, dones: np.ndarray, valid: np.ndarray | None,
            keep: bool) -> list[tuple[int, int, dict[str, float]]]:
        """:meth:`add` one step at a time, for blocks so small (off-policy iterations of one env step) that the
        prefix-sum path's fixed numpy calls cost more than the steps. Same episodes, same order."""
        out = []
        rewards_l, dones_l = rewards.tolist(), dones.tolist()
        valid_l = None if valid is None else np.asarray(valid, dtype=bool).tolist()
        for i, (row_r, row_d) in enumerate(zip(rewards_l, dones_l, strict=True)):
            ret, disc, disc_pow = float(self._ret[i]), float(self._disc_ret[i]), float(self._disc_pow[i])
            length, nonzero = int(self._len[i]), int(self._nonzero[i])
            for t, (r, d) in enumerate(zip(row_r, row_d, strict=True)):
                if valid_l is not None and not valid_l[i][t]:
                    break  # valid steps form a prefix of each row (wait-reset)
                ret += r
                disc += disc_pow * r
                disc_pow *= self.discount
                length += 1
                nonzero += r != 0
                if d:
                    if keep:
                        out.append((t, i, self._info(length, ret, nonzero, disc)))
                    ret = disc = 0.0
                    disc_pow = 1.0
                    length = nonzero = 0
            self._ret[i], self._disc_ret[i], self._disc_pow[i] = ret, disc, disc_pow
            self._len[i], self._nonzero[i] = length, nonzero
        return out


def group_name(key: NestedKey) -> str:
    """How TrajInfos name the agent group at ``key`` (:func:`~tdrl.collect.layout.group_keys`): a nested key
    joined with ``/``."""
    return key if isinstance(key, str) else "/".join(key)


def group_rewards(batch: TensorDictBase, keys: Sequence[NestedKey], lo: int = 0,
                  hi: int | None = None) -> dict[str, np.ndarray]:
    """``{group_name(key): [hi - lo, T]}``: rows ``lo:hi`` of a ``[B, T]`` batch's ``("next", *key, "reward")``
    summed over the group's agents (float64, on the host), as :meth:`EpisodeTracker.add` takes them; ``keys`` are
    the step TensorDict's :func:`~tdrl.collect.layout.group_keys`."""
    out = {}
    for key in keys:
        reward = batch.get(("next", *((key,) if isinstance(key, str) else key), "reward"))[lo:hi].cpu().numpy()
        out[group_name(key)] = reward.reshape(*reward.shape[:2], -1).sum(-1, dtype=np.float64)
    return out
