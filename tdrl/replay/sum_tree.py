"""A float64 k-ary sum tree with vectorised batch updates and prefix-sum search.

Why our own: TorchRL 0.14.1's C++ segment trees do not import against torch 2.13 (pytorch/rl#3508), and rlpyt
found float32 trees return zero-priority leaves through rounding, so the tree is float64.

Why k-ary (default 32 children per node) rather than binary: every operation costs one vectorised numpy step per
level, and numpy's per-call overhead dominates for batches of a few hundred. A 1M-leaf binary tree has 20 levels,
a 32-ary one has 4, so a batch search or update of 256 leaves is about 4x cheaper.

All levels live in one flat float64 array, so the tree can sit in shared memory (an ``np.memmap``) and be used by
several processes; callers serialise access (see :class:`tdrl.replay.storage.MemmapStore.lock`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SumTree"]


def _level_sizes(capacity: int, branching: int) -> list[int]:
    """Sizes of each level from the leaves up, each padded to a multiple of ``branching``."""
    sizes = []
    n = capacity
    while True:
        padded = -(-n // branching) * branching
        sizes.append(padded)
        if padded == branching:
            return sizes
        n = padded // branching


class SumTree:
    """Sum tree over ``capacity`` non-negative float64 leaves.

    Args:
        capacity: number of leaves.
        branching: children per node (>= 2).
        storage: optional flat float64 array of at least :meth:`storage_size` elements to hold the tree (e.g. a
            memmap shared between processes). A fresh zeroed array is allocated when omitted.

    Leaves with value 0 are never returned by :meth:`find`.
    """

    def __init__(self, capacity: int, branching: int = 32, storage: np.ndarray | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if branching < 2:
            raise ValueError(f"branching must be >= 2, got {branching}")
        self.capacity = int(capacity)
        self.branching = int(branching)
        sizes = _level_sizes(self.capacity, self.branching)
        total = sum(sizes)
        if storage is None:
            storage = np.zeros(total, dtype=np.float64)
        elif storage.dtype != np.float64 or storage.ndim != 1 or storage.size < total:
            raise ValueError(f"storage must be a flat float64 array with >= {total} elements")
        self.storage = storage
        self.levels: list[np.ndarray] = []
        offset = 0
        for size in sizes:
            self.levels.append(storage[offset : offset + size])
            offset += size
        self._arange = np.arange(self.branching, dtype=np.int64)

    @staticmethod
    def storage_size(capacity: int, branching: int = 32) -> int:
        """Number of float64 elements a tree of this shape needs."""
        return sum(_level_sizes(capacity, branching))

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
            if index.size > 4 * k:
                index = np.unique(index)
            children = self.levels[level - 1][index[:, None] * k + self._arange]
            self.levels[level][index] = children.sum(axis=1)

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (after writing :attr:`leaves` directly)."""
        k = self.branching
        for level in range(1, len(self.levels)):
            sums = self.levels[level - 1].reshape(-1, k).sum(axis=1)
            self.levels[level][: sums.size] = sums
            self.levels[level][sums.size :] = 0.0

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaf index whose prefix-sum interval contains each ``mass`` in ``[0, total)``.

        Rounding can push a mass to the end of a node's interval; the search then clamps to the node's last
        positive child, so a zero leaf is never returned while the tree total is positive.
        """
        mass = np.array(mass, dtype=np.float64).reshape(-1)
        node = np.zeros(mass.shape[0], dtype=np.int64)
        k = self.branching
        rows = np.arange(mass.shape[0])
        for level in range(len(self.levels) - 1, -1, -1):
            children = self.levels[level][node[:, None] * k + self._arange]
            cumsum = np.cumsum(children, axis=1)
            child = (cumsum <= mass[:, None]).sum(axis=1)
            last_positive = k - 1 - np.argmax(children[:, ::-1] > 0, axis=1)
            child = np.minimum(child, last_positive)
            has_left = child > 0
            mass = mass - np.where(has_left, cumsum[rows, np.maximum(child - 1, 0)], 0.0)
            node = node * k + child
        return node
