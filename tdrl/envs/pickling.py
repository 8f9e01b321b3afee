"""Pickled bytes that depend on an object's values only, for env states compared bitwise (:mod:`tdrl.envs.state`).

Pickle writes a second reference to one object as a back-reference, so two equal states pickle to different bytes
when one holds an object twice and the other two equal objects: an env restored from a checkpoint holds the
unpickled copies where the saved env held, say, numpy's cached dtype or an interned attribute name. A resumed run
would then checkpoint different bytes for the same state. :func:`canonical_dumps` pickles strings interned, tuples
of plain values shared by value and numpy arrays and scalars by value (their dtype as an interned string), so
equal values pickle to equal bytes, whichever objects hold them; what ``pickle.loads`` returns is unchanged.
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

import numpy as np

__all__ = ["canonical_dumps"]


def _array(data: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _scalar(data: bytes, dtype: str) -> np.generic:
    return np.frombuffer(data, dtype=dtype)[0]


class _StatePickler(pickle._Pickler):  # the Python pickler: its save() sees every object (str, tuple...)
    """Pickles an env's state to bytes that depend on its values only, not on which equal objects happen to be
    one object (pickle writes a second reference to an object as a back-reference): an env restored from a state
    then pickles to the same bytes as the env it was saved from, as bitwise resume checks need. Strings are
    interned and tuples of plain values shared by value; numpy arrays and scalars go by value with their dtype
    as an interned string (an unpickled array's dtype is another object than numpy's cached one)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tuples: dict[Any, tuple] = {}

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if type(obj) is str:
            obj = sys.intern(obj)
        elif type(obj) is tuple:
            key = _plain_key(obj)
            if key is not None:
                obj = self.tuples.setdefault(key, obj)
        super().save(obj, save_persistent_id)  # type: ignore[misc]  # typeshed omits _Pickler.save

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is np.ndarray and not obj.dtype.hasobject:
            return _array, (obj.tobytes(), sys.intern(obj.dtype.str), obj.shape)
        if isinstance(obj, np.generic) and not obj.dtype.hasobject:
            return _scalar, (obj.tobytes(), sys.intern(obj.dtype.str))
        return NotImplemented


def _plain_key(value: Any) -> Any:
    """A key equal for equal tuples of plain values (floats by their bits), ``None`` for anything else."""
    if type(value) is tuple:
        keys = [_plain_key(item) for item in value]
        return None if any(k is None for k in keys) else ("t", *keys)
    if type(value) is float:
        return ("f", value.hex())
    if type(value) in (int, str, bool, bytes) or value is None:
        return (type(value).__name__, value)
    return None


def canonical_dumps(value: Any) -> bytes:
    """``pickle.dumps(value)``, with equal values giving equal bytes (module docstring)."""
    buffer = io.BytesIO()
    _StatePickler(buffer).dump(value)
    return buffer.getvalue()
