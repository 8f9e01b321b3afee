"""The stored-key schema of a replay buffer: learnt from the first batch, checked on every later one.

Every check runs before anything is written, so a bad batch raises :class:`ReplayError` naming the offending key and
leaves the stored data untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

__all__ = ["BatchSchema", "ReplayError", "as_key", "key_name", "nest", "pack"]


class ReplayError(ValueError):
    """A batch, priority or request a replay buffer cannot accept; the message names the field."""


def as_key(key: NestedKey) -> tuple[str, ...]:
    """Normalise a nested key to a tuple of strings."""
    return (key,) if isinstance(key, str) else tuple(key)


def key_name(key: tuple[str, ...]) -> str:
    """File-system and message friendly name of a nested key: ``("next", "reward")`` -> ``next.reward``."""
    return ".".join(key)


class BatchSchema:
    """Keys, dtypes and per-step shapes of the tensors a buffer stores.

    Args:
        entries: key -> (dtype, per-step shape, i.e. the shape after the batch dimensions).
        strict: whether keys a batch has beyond the schema are an error rather than dropped silently (not for
            buffers built with an explicit ``keys=`` selection).
        ignored: keys a batch may carry that the schema does not store (frame stacks, input priorities, ...).
        sub_dims: nested TensorDicts with batch dimensions of their own after the batch's: key -> those dims (a
            multi-agent group ``("agents",)`` -> ``(n_agents,)``), so :func:`nest` gives samples the same layout.
    """

    def __init__(self, entries: Mapping[tuple[str, ...], tuple[torch.dtype, tuple[int, ...]]], strict: bool = True,
                 ignored: Iterable[tuple[str, ...]] = (),
                 sub_dims: Mapping[tuple[str, ...], tuple[int, ...]] | None = None) -> None:
        self.entries = entries
        self.strict = strict
        self.ignored = {tuple(k) for k in ignored}
        self.sub_dims = dict(sub_dims or {})
        self._groups: dict[tuple[str, ...], set[str]] = {}  # prefix -> names below it, for the extra-key check
        for key in entries:
            for depth in range(len(key)):
                self._groups.setdefault(key[:depth], set()).add(key[depth])

    @classmethod
    def from_batch(cls, batch: TensorDictBase, batch_dims: int, keys: Sequence[NestedKey] | None = None,
                   exclude: Iterable[NestedKey] = ()) -> BatchSchema:
        """Schema of ``batch`` (all tensor leaves, or only ``keys``), minus ``exclude``."""
        excluded = {as_key(k) for k in exclude}
        entries = {}
        for key in map(as_key, batch.keys(include_nested=True, leaves_only=True) if keys is None else keys):
            if key in excluded or any(key[: len(e)] == e for e in excluded):
                continue
            value = batch.get(key, None)
            if value is None:
                raise ReplayError(f"batch is missing key {key_name(key)!r} (named in keys= or state_keys=)")
            if not isinstance(value, torch.Tensor):
                continue
            entries[key] = (value.dtype, value.shape[batch_dims:])
        return cls(entries, strict=keys is None, ignored=excluded, sub_dims=_sub_dims(batch, entries, batch_dims))

    def check(self, batch: TensorDictBase, batch_shape: torch.Size) -> dict[tuple[str, ...], torch.Tensor]:
        """Validate ``batch`` against the schema and return its stored tensors by key.

        Raises:
            ReplayError: a key is missing or unexpected, or a tensor has the wrong dtype or shape.
        """
        out = {}
        tree = batch.to_dict()  # the same tensors as nested dicts: plain lookups, cheaper than TensorDict.get
        for key, (dtype, shape) in self.entries.items():
            value = tree
            for part in key:
                value = value.get(part) if isinstance(value, dict) else None
            if not isinstance(value, torch.Tensor):
                raise ReplayError(f"batch is missing key {key_name(key)!r} that this buffer stores")
            if value.dtype != dtype:
                raise ReplayError(f"key {key_name(key)!r} has dtype {value.dtype}, the buffer stores {dtype}")
            if value.shape[len(batch_shape):] != shape or value.shape[: len(batch_shape)] != batch_shape:
                raise ReplayError(f"key {key_name(key)!r} has shape {tuple(value.shape)}, expected "
                                  f"{tuple(batch_shape) + tuple(shape)} (batch dims {tuple(batch_shape)} + "
                                  f"per-step shape {tuple(shape)})")
            # batches from a GPU collector are stored in CPU memory (replay never holds device copies)
            out[key] = value if value.device.type == "cpu" else value.to("cpu")
        if self.strict:
            self._check_no_extra(tree)
        return out

    def _check_no_extra(self, tree: dict[str, Any]) -> None:
        for prefix, names in self._groups.items():
            node = tree
            for part in prefix:
                node = node[part]
            if len(node) != len(names):
                extra = sorted(n for n in set(node) - names if not self._is_ignored(prefix + (n,)))
                if extra:
                    raise ReplayError(f"batch has key {key_name(prefix + (extra[0],))!r} that this buffer does "
                                      f"not store (stored keys are fixed by the first batch; pass keys=[...] to "
                                      f"store a selection)")

    def _is_ignored(self, key: tuple[str, ...]) -> bool:
        """An ignored key, inside one, or a sub-tree holding one (``recurrent_state`` for ``recurrent_state.h``)."""
        return any(key[: len(k)] == k or k[: len(key)] == key for k in self.ignored)

    def to_json(self) -> dict[str, Any]:
        out = {"entries": [{"key": list(k), "dtype": str(d).removeprefix("torch."), "shape": list(s)}
                           for k, (d, s) in self.entries.items()],
               "strict": self.strict, "ignored": [list(k) for k in sorted(self.ignored)]}
        if self.sub_dims:  # absent in buffers without nested batch dims (and in those written before they were kept)
            out["sub_dims"] = [{"key": list(k), "dims": list(d)} for k, d in self.sub_dims.items()]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchSchema:
        entries = {tuple(e["key"]): (getattr(torch, e["dtype"]), torch.Size(e["shape"])) for e in data["entries"]}
        sub_dims = {tuple(e["key"]): tuple(e["dims"]) for e in data.get("sub_dims", [])}
        return cls(entries, data["strict"], [tuple(k) for k in data["ignored"]], sub_dims)


def _sub_dims(batch: TensorDictBase, entries: Mapping[tuple[str, ...], Any], batch_dims: int
              ) -> dict[tuple[str, ...], tuple[int, ...]]:
    """The extra batch dims of each nested TensorDict above a stored key (a group's ``[B, T, n_agents]``)."""
    out = {}
    for key in entries:
        for depth in range(1, len(key)):
            sub = batch.get(key[:depth])
            if isinstance(sub, TensorDictBase) and sub.batch_dims > batch_dims:
                out[key[:depth]] = tuple(sub.batch_size[batch_dims:])
    return out


def pack(schema: BatchSchema) -> dict[str, list]:
    """Keys packed into one ``[B, T_cap, width]`` field per (root | next, dtype), so a write or gather is one copy
    per group, not per key: group -> ``[(key, offset, size, per-step shape)]``."""
    groups: dict[str, list] = {}
    for key, (dtype, shape) in schema.entries.items():
        members = groups.setdefault(f"{'next' if key[0] == 'next' else 'root'}.{str(dtype).removeprefix('torch.')}", [])
        offset = members[-1][1] + members[-1][2] if members else 0
        members.append((key, offset, int(torch.Size(shape).numel()), shape))
    return groups


def nest(flat: Mapping[tuple[str, ...], torch.Tensor | TensorDictBase], batch_size: Sequence[int],
         sub_dims: Mapping[tuple[str, ...], tuple[int, ...]] | None = None) -> TensorDict:
    """Build a TensorDict from ``{nested key: tensor}`` (faster than the TensorDict constructor on tuple keys);
    ``sub_dims`` (:class:`BatchSchema`'s) give nested TensorDicts their own extra batch dims after ``batch_size``."""
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    out = TensorDict(tree, batch_size=batch_size)
    for key in sorted(sub_dims or {}, key=len, reverse=True):  # innermost first: a parent's dims prefix its children's
        sub = out.get(key, None)
        if isinstance(sub, TensorDictBase):
            sub.batch_size = torch.Size([*batch_size, *sub_dims[key]])  # type: ignore[index]
    return out
