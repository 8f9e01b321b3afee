"""Memmapped fields under one explicit directory, with counters and a lock shared across processes.

The directory is always explicit, normally under the run directory (TorchRL's temporary default installs its own
SIGTERM handler, which breaks SLURM preemption). It holds one raw ``.bin`` file per field (an ``np.memmap`` viewed
as a plain tensor: ``MemoryMappedTensor``'s ``__torch_function__`` dispatch makes every copy slower), ``meta.json``
(layout), ``counters.i64`` (int64 counters every process reads and writes) and ``lock`` (an ``flock`` file, only
around priority-tree updates).

Concurrency, one writer and any number of readers: a write of ``T`` steps publishes ``write_started += T``, copies
the data, then publishes ``write_done = write_started``. A reader draws from the data complete at ``write_done``,
gathers, then re-reads ``write_started``: any slot older than ``write_started - time_capacity`` may have been
overwritten during the read and is drawn again. Aligned 8-byte loads and stores are atomic and not reordered on
x86-64, which is all this seqlock needs; data is never locked, so sampling never waits for an extend.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdrl.utils.files import write_atomic

__all__ = ["MemmapStore"]

_COUNTERS = ("write_started", "write_done", "samples_drawn")
_N_COUNTERS = 8  # room for later counters without changing the file size


class MemmapStore:
    """Fixed-size memmapped fields plus shared counters, in ``directory``.

    Args:
        directory: where the files live; created if missing. Constructing a store starts an *empty* store there
            (counters zeroed); existing field files of the right size are reused rather than re-created, which is
            what lets a checkpointed buffer reopen its data in place (:meth:`restore`).

    Pickling a store (e.g. passing the buffer to a spawned process) sends only the directory; the other process
    maps the same files, so both see the same data and counters.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        np.memmap(self.directory / "counters.i64", dtype=np.int64, mode="w+", shape=(_N_COUNTERS,))  # zeroed
        (self.directory / "meta.json").unlink(missing_ok=True)
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._counters_map = np.memmap(self.directory / "counters.i64", dtype=np.int64, mode="r+",
                                       shape=(_N_COUNTERS,))
        # plain ndarray view: np.memmap's Python-level __getitem__ is slow on the hot path
        self._counters = self._counters_map.view(np.ndarray)
        self.fields: dict[str, torch.Tensor] = {}
        self._arrays: dict[str, np.memmap] = {}
        self.meta: dict[str, Any] | None = None
        self._thread_lock = threading.RLock()
        self._lock_fd: int | None = None
        self.shared = False

    def __getstate__(self) -> dict[str, Any]:
        self.shared = True  # from now on another process may hold the store: lock() takes the file lock
        return {"directory": str(self.directory)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.directory = Path(state["directory"])
        self._init_process_state()
        self.shared = True
        self.ensure_open()

    @property
    def allocated(self) -> bool:
        """Whether the fields exist (in this process)."""
        return self.meta is not None

    def allocate(self, fields: dict[str, tuple[tuple[int, ...], torch.dtype]], meta: dict[str, Any], *,
                 keep_data: bool = True) -> None:
        """Create (or reuse, when present with the right size and ``keep_data``) one file per field
        ``name -> (shape, dtype)``, then write ``meta.json`` (the fields and the JSON ``meta`` a buffer needs to
        reopen the store). New files are sparse and read as zeros."""
        spec = {name: {"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")} for name, (shape, dtype)
                in fields.items()}
        self.meta = {"fields": spec, **meta}
        self._map_fields(create=True, keep_data=keep_data)
        write_atomic(self.directory / "meta.json", json.dumps(self.meta, indent=1))

    def ensure_open(self) -> bool:
        """Map the fields if another process has allocated them since; returns :attr:`allocated`."""
        if self.meta is None and (self.directory / "meta.json").exists():
            self.meta = json.loads((self.directory / "meta.json").read_text())
            self._map_fields(create=False)
        return self.allocated

    def _map_fields(self, create: bool, keep_data: bool = True) -> None:
        assert self.meta is not None  # set by the callers: allocate(), ensure_open()
        self.fields, self._arrays = {}, {}
        for name, spec in self.meta["fields"].items():
            shape = tuple(spec["shape"])
            path = self.directory / f"{name}.bin"
            dtype = torch.empty((), dtype=getattr(torch, spec["dtype"])).numpy().dtype
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            reuse = keep_data and path.exists() and path.stat().st_size == nbytes
            self._arrays[name] = np.memmap(path, dtype=dtype, mode="r+" if (reuse or not create) else "w+",
                                           shape=shape)
            self.fields[name] = torch.from_numpy(self._arrays[name])

    def counter(self, name: str) -> int:
        """Current value of a shared counter (one of ``_COUNTERS``)."""
        return int(self._counters[_COUNTERS.index(name)])

    def add_counter(self, name: str, value: int) -> None:
        """Add to a counter. Not atomic across processes: each counter has one writing process by convention."""
        self._counters[_COUNTERS.index(name)] += value

    def begin_write(self, steps: int) -> int:
        """Publish that ``steps`` time steps are being written; returns the absolute time of the first one."""
        start = int(self._counters[1])
        self._counters[0] = start + steps
        return start

    def end_write(self) -> None:
        """Publish the write begun by :meth:`begin_write` as complete."""
        self._counters[1] = self._counters[0]

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock across threads and processes (``flock`` on ``directory/lock``, taken only once the store
        has been pickled: a store that never left its process needs only the thread lock)."""
        with self._thread_lock:
            if not self.shared:
                yield
                return
            if self._lock_fd is None:
                self._lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def state_dict(self) -> dict[str, Any]:
        """Counters and layout (no data: the field files stay in :attr:`directory`)."""
        return {"counters": {name: self.counter(name) for name in _COUNTERS}, "meta": self.meta}

    def restore(self, state: dict[str, Any], *, keep_data: bool = True) -> None:
        """Reopen the field files in place with the layout and counters of :meth:`state_dict` (``keep_data=False``:
        recreate them all zero, to be filled from a checkpoint)."""
        if state["meta"] is not None:
            fields = {name: (tuple(spec["shape"]), getattr(torch, spec["dtype"]))
                      for name, spec in state["meta"]["fields"].items()}
            self.allocate(fields, {k: v for k, v in state["meta"].items() if k != "fields"}, keep_data=keep_data)
        for name, value in state["counters"].items():
            self._counters[_COUNTERS.index(name)] = value

    def flush(self) -> None:
        """Write dirty pages of every field to disk (``msync``)."""
        for array in self._arrays.values():
            array.flush()
        self._counters_map.flush()

    def copy_files_from(self, path: str | os.PathLike) -> None:
        """Copy whole field files (``<name>.bin``, as checkpoints held them before
        :mod:`tdrl.replay.segments`) into this (already allocated) store, in place."""
        for name, array in self._arrays.items():
            src = Path(path) / f"{name}.bin"
            if not src.exists() or src.stat().st_size != array.nbytes:
                raise FileNotFoundError(f"replay field file {src} is missing or has the wrong size "
                                        f"(expected {array.nbytes} bytes)")
            np.copyto(array, np.memmap(src, dtype=array.dtype, mode="r", shape=array.shape))

    def nbytes(self) -> int:
        """Bytes held by the field files."""
        return sum(array.nbytes for array in self._arrays.values())
