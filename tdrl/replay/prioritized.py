"""Prioritized sampling (Schaul et al. 2016) on a float64 sum tree, behind TorchRL's ``Sampler`` interface.

Ours because TorchRL 0.14.1's ``PrioritizedSampler`` needs its C++ extension, which fails to import against torch
2.13 (pytorch/rl#3508). Pure numpy, so it works with ``torchrl.data.ReplayBuffer`` and inside tdrl's buffers.

A leaf holds ``(priority + eps) ** alpha`` and is drawn stratified with probability ``leaf / total``. Importance
weights ``(N * P(i)) ** -beta`` are normalised by the batch maximum (rlpyt); ``beta`` anneals linearly from
``beta_init`` to ``beta_final`` over ``beta_steps`` added transitions. A zero leaf is invalid: buffers hide
incomplete or overwritten slots that way, and :meth:`update` never revives one. Inside a tdrl buffer the arrays are
memmaps in its directory, so processes share one tree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import Sampler

from tdrl.replay.schema import ReplayError
from tdrl.replay.sum_tree import SumTree
from tdrl.utils.keys import WEIGHT_KEY
from tdrl.utils.seeding import numpy_generator

__all__ = ["PrioritizedSampler", "check_priorities"]

_STEPS, _MAX_PRIORITY = 0, 1


def check_priorities(priority: Any, name: str = "priority") -> np.ndarray:
    """Priorities as a flat float64 array; raises :class:`ReplayError` on NaN, inf or negative values."""
    if isinstance(priority, torch.Tensor):
        priority = priority.detach().to("cpu", torch.float64).numpy()
    array = np.asarray(priority, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(array)):
        raise ReplayError(f"{name} contains NaN or inf (first bad position {int(np.argmin(np.isfinite(array)))})")
    if np.any(array < 0):
        raise ReplayError(f"{name} contains negative values (min {array.min():.4g}); priorities must be >= 0")
    return array


class PrioritizedSampler(Sampler):
    """Float64 sum-tree prioritized sampler.

    Args:
        max_capacity: number of leaves; tdrl buffers size it, ``torchrl.data.ReplayBuffer`` needs it.
        alpha: priority exponent (0 = uniform); ``beta_*``: the importance-weight exponent's schedule.
        eps: added to every priority so a zero TD error still leaves a small chance of replay.
        default_priority: priority of new data; ``None`` uses the largest priority seen so far.
        seed: of the sampler's own generator.
    """

    def __init__(self, max_capacity: int | None = None, *, alpha: float = 0.6, beta_init: float = 0.4,
                 beta_final: float = 1.0, beta_steps: int = 1, eps: float = 1e-6,
                 default_priority: float | None = None, seed: int | None = None) -> None:
        if alpha < 0 or beta_init < 0 or beta_final < 0 or beta_steps < 1 or eps <= 0:
            raise ValueError(f"need alpha, beta_init, beta_final >= 0, beta_steps >= 1 and eps > 0 (a zero leaf means "
                             f"'invalid'), got {alpha}, {beta_init}, {beta_final}, {beta_steps}, {eps}")
        if default_priority is not None:
            check_priorities(default_priority, "default_priority")
        self.alpha = float(alpha)
        self.beta_init = float(beta_init)
        self.beta_final = float(beta_final)
        self.beta_steps = int(beta_steps)
        self.eps = float(eps)
        self._default_priority = default_priority
        self.rng = numpy_generator(seed)
        self._directory: Path | None = None
        self.capacity: int | None = None
        if max_capacity is not None:
            self.bind(max_capacity)

    def bind(self, capacity: int, directory: str | os.PathLike | None = None, *, create: bool = True) -> None:
        """Allocate the tree for ``capacity`` leaves, in RAM or as memmaps in ``directory`` (shared); with
        ``create=False``, map the tree another process bound there."""
        self.capacity = int(capacity)
        self._directory = Path(directory) if directory is not None else None
        size = self.capacity + 2 + SumTree.storage_size(self.capacity)  # raw, scalars, tree
        if self._directory is None:
            storage = np.zeros(size, dtype=np.float64)
        else:  # a plain ndarray view: np.memmap's Python-level __getitem__ is slow on every tree access
            storage = np.memmap(self._directory / "priorities.f64", dtype=np.float64, mode="w+" if create else "r+",
                                shape=(size,)).view(np.ndarray)
        self._raw, self._scalars = storage[: self.capacity], storage[self.capacity : self.capacity + 2]
        if create:
            self._scalars[:] = [0.0, 1.0]
        self._tree = SumTree(self.capacity, storage=storage[self.capacity + 2 :])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self._directory is not None:  # the other process maps the same files
            for name in ("_raw", "_tree", "_scalars"):
                state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._directory is not None and self.capacity is not None:
            self.bind(self.capacity, self._directory, create=False)

    @property
    def beta(self) -> float:
        """Current importance-weight exponent (annealed by transitions added)."""
        steps = float(self._scalars[_STEPS]) if self.capacity is not None else 0.0
        frac = min(1.0, steps / self.beta_steps)
        return self.beta_init + frac * (self.beta_final - self.beta_init)

    @property
    def default_priority(self) -> float:
        if self._default_priority is not None:
            return float(self._default_priority)
        return float(self._scalars[_MAX_PRIORITY]) if self.capacity is not None else 1.0

    @property
    def total(self) -> float:
        return self._tree.total

    def leaf_values(self, index: np.ndarray) -> np.ndarray:
        """Tree values ``(priority + eps) ** alpha`` of ``index`` (0 where invalid)."""
        return self._tree.leaves[np.asarray(index, dtype=np.int64)]

    def priorities(self, index: np.ndarray) -> np.ndarray:
        """Raw priorities last assigned to ``index``."""
        return self._raw[np.asarray(index, dtype=np.int64)]

    def advance(self, transitions: int) -> None:
        """Count added transitions for the beta schedule."""
        self._scalars[_STEPS] += transitions

    def assign(self, index: np.ndarray, priority: np.ndarray | None = None) -> None:
        """Give new data at ``index`` a priority (the default when ``None``); :meth:`activate` makes it sampleable."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        if priority is None:
            self._raw[index] = self.default_priority
        else:
            self._raw[index] = np.broadcast_to(check_priorities(priority), index.shape)
            self._track_max(self._raw[index])

    def activate(self, index: np.ndarray, valid: np.ndarray | None = None) -> None:
        """Make ``index`` sampleable with its stored raw priority (where ``valid``)."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        value = (self._raw[index] + self.eps) ** self.alpha
        if valid is not None:
            value = np.where(np.asarray(valid).reshape(-1), value, 0.0)
        self._tree.update(index, value)

    def invalidate(self, index: np.ndarray) -> None:
        """Make ``index`` unsampleable (its raw priority is kept)."""
        self._tree.update(index, 0.0)

    def update(self, index: np.ndarray, priority: Any) -> None:
        """Set new priorities (one, or one per index) for ``index``; leaves that are invalid now stay invalid."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        raw = check_priorities(priority)
        if raw.size not in (1, index.size):
            raise ReplayError(f"priority has {raw.size} values for {index.size} indices")
        if index.size and (index.min() < 0 or index.max() >= self.capacity):
            raise ReplayError(f"index out of range [0, {self.capacity}) in priority update")
        raw = np.broadcast_to(raw, index.shape)
        self._track_max(raw)
        live = self._tree.leaves[index] > 0
        self._raw[index] = raw
        self._tree.update(index[live], (raw[live] + self.eps) ** self.alpha)

    def _track_max(self, raw: np.ndarray) -> None:
        if self._default_priority is None and raw.size:
            self._scalars[_MAX_PRIORITY] = max(float(self._scalars[_MAX_PRIORITY]), float(raw.max()))

    def draw_leaves(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` leaves (stratified); returns ``(leaves, leaf values)``."""
        total = self._tree.total
        if not total > 0:
            raise ReplayError("cannot sample: no sampleable transitions (all priorities are zero or invalid)")
        mass = (np.arange(n) + self.rng.random(n)) * (total / n)
        index = self._tree.find(np.minimum(mass, np.nextafter(total, 0)))
        return index, self._tree.leaves[index]

    def importance_weights(self, values: np.ndarray) -> np.ndarray:
        """``(N * P(i)) ** -beta`` normalised by the batch maximum, from the drawn leaves' values (float32)."""
        return ((values / values.min()) ** (-self.beta)).astype(np.float32)

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` leaves (stratified) and their normalised importance weights (float32)."""
        index, values = self.draw_leaves(n)
        return index, self.importance_weights(values)

    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict]:
        if len(storage) == 0:
            raise ReplayError("cannot sample from an empty storage")
        if self.capacity is None:
            raise ReplayError("PrioritizedSampler needs max_capacity when used with torchrl.data.ReplayBuffer")
        index, weights = self.draw(batch_size)
        index_t = torch.from_numpy(index)
        return index_t, {WEIGHT_KEY: torch.from_numpy(weights), "index": index_t}

    def add(self, index: int) -> None:
        self.extend(torch.as_tensor([index]))

    def extend(self, index: torch.Tensor) -> None:
        if self.capacity is None:
            raise ReplayError("PrioritizedSampler needs max_capacity when used with torchrl.data.ReplayBuffer")
        leaves = torch.as_tensor(index).reshape(-1).cpu().numpy()
        self.assign(leaves)
        self.activate(leaves)
        self.advance(leaves.size)

    def update_priority(self, index: int | torch.Tensor, priority: float | torch.Tensor, *,
                        storage: Any = None) -> None:
        self.update(torch.as_tensor(index).reshape(-1).cpu().numpy(), priority)

    def _empty(self) -> None:
        if self.capacity is not None:
            self.bind(self.capacity, self._directory)

    def state_dict(self) -> dict[str, Any]:
        """Raw priorities, tree leaves, beta progress, max priority and RNG state (tensors, for ``torch.save``)."""
        if self.capacity is None:
            return {"capacity": None, "rng": self.rng.bit_generator.state}
        return {
            "capacity": self.capacity, "raw": torch.from_numpy(np.array(self._raw)),
            "leaves": torch.from_numpy(np.array(self._tree.leaves)),
            "scalars": torch.from_numpy(np.array(self._scalars)), "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state_dict["rng"]
        if state_dict["capacity"] is None:
            return
        if self.capacity != state_dict["capacity"]:
            self.bind(state_dict["capacity"], self._directory)
        self._raw[:] = state_dict["raw"].numpy()
        self._tree.leaves[:] = state_dict["leaves"].numpy()
        self._tree.rebuild()
        self._scalars[:] = state_dict["scalars"].numpy()

    def dumps(self, path: str | os.PathLike) -> None:
        """Write the sampler state into the directory ``path``."""
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "sampler.pt")

    def loads(self, path: str | os.PathLike) -> None:
        self.load_state_dict(torch.load(Path(path) / "sampler.pt", weights_only=False))
