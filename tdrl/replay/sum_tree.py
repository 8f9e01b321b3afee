"""A float64 k-ary sum tree with vectorised batch updates and prefix-sum search.

Ours because TorchRL 0.14.1's C++ segment trees do not import against torch 2.13 (pytorch/rl#3508); float64 because
rlpyt found float32 trees return zero-priority leaves through rounding. 16-ary rather than binary: a search touches
few levels, each node's children gathered as a ``[k, batch]`` block with prefix sums by one small triangular matmul.
Updates recompute each touched parent from its children, so rounding never accumulates. All levels live in one flat
array, so the tree can sit in a shared ``np.memmap``; callers serialise access (``MemmapStore.lock``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SumTree"]


def _level_sizes(capacity: int, branching: int, top_max: int) -> list[int]:
    """Level sizes from the leaves up: each level is exactly ``branching`` times the one above (leaves padded),
    and the top level has at most ``top_max`` nodes."""
    top, depth = capacity, 0
    while top > top_max:
        top = -(-top // branching)
        depth += 1
    return [top * branching**d for d in range(depth, -1, -1)]


class SumTree:
    """Sum tree over ``capacity`` non-negative float64 leaves; :meth:`find` never returns a zero leaf while the total
    is positive.

    Args:
        capacity: number of leaves.
        branching: children per internal node (>= 2).
        storage: flat float64 array of at least :meth:`storage_size` elements to hold the tree (e.g. a memmap shared
            between processes); a fresh zeroed array when omitted.
        top_max: largest top level, searched directly.
    """

    def __init__(self, capacity: int, branching: int = 16, storage: np.ndarray | None = None,
                 top_max: int = 256) -> None:
        if capacity < 1 or branching < 2:
            raise ValueError(f"need capacity >= 1 and branching >= 2, got {capacity}, {branching}")
        self.capacity = int(capacity)
        self.branching = int(branching)
        sizes = _level_sizes(self.capacity, self.branching, top_max)
        self.storage = np.zeros(sum(sizes), dtype=np.float64) if storage is None else storage
        if self.storage.dtype != np.float64 or self.storage.ndim != 1 or self.storage.size < sum(sizes):
            raise ValueError(f"storage must be a flat float64 array with >= {sum(sizes)} elements")
        offsets = np.cumsum([0, *sizes])
        self.levels = [self.storage[lo:hi] for lo, hi in zip(offsets[:-1], offsets[1:], strict=True)]
        self._column = np.arange(self.branching, dtype=np.int64)[:, None]
        self._lower = np.tril(np.ones((self.branching, self.branching)))

    @staticmethod
    def storage_size(capacity: int, branching: int = 16, top_max: int = 256) -> int:
        """Number of float64 elements a tree of this shape needs."""
        return sum(_level_sizes(capacity, branching, top_max))

    @property
    def leaves(self) -> np.ndarray:
        """Leaf values (a view; write through :meth:`update` so the sums stay right)."""
        return self.levels[0][: self.capacity]

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self.levels[-1].sum())

    def update(self, index: np.ndarray, value: np.ndarray | float) -> None:
        """Set leaves ``index`` to ``value`` and recompute their ancestors.

        Duplicate indices are allowed (the last value wins). Parents are recomputed from their children rather than
        adjusted by deltas, so no rounding error accumulates over millions of updates.
        """
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        if index.size == 0:
            return
        self.levels[0][index] = value
        k = self.branching
        for level in range(1, len(self.levels)):
            index = index // k
            if index.size > 8192:  # big contiguous writes: dedupe parents (duplicates are harmless otherwise)
                index = np.unique(index)
            children = self.levels[level - 1][self._column + index * k]  # [k, n]
            self.levels[level][index] = children.sum(axis=0)

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (after writing :attr:`leaves` directly)."""
        k = self.branching
        for level in range(1, len(self.levels)):
            self.levels[level][:] = self.levels[level - 1].reshape(-1, k).sum(axis=1)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaf index whose prefix-sum interval contains each ``mass`` in ``[0, total)``."""
        mass = np.array(mass, dtype=np.float64).reshape(-1)
        top = self.levels[-1]
        prefix = np.cumsum(top)
        node = np.minimum(np.searchsorted(prefix, mass, side="right"), top.size - 1)
        mass = mass - (prefix[node] - top[node])
        columns = np.arange(mass.shape[0])
        k = self.branching
        for level in range(len(self.levels) - 2, -1, -1):
            base = node * k
            children = self.levels[level][self._column + base]  # [k, n]
            inclusive = self._lower @ children  # prefix sums down each column
            child = np.minimum((inclusive <= mass).sum(axis=0), k - 1)
            mass = mass - (inclusive[child, columns] - children[child, columns])
            node = base + child
        bad = self.levels[0][node] <= 0
        if bad.any():  # rounding walked into a zero subtree (rare): take the next positive leaf, else the last
            positive = np.flatnonzero(self.leaves > 0)
            node[bad] = positive[np.minimum(np.searchsorted(positive, node[bad]), positive.size - 1)]
        return node
