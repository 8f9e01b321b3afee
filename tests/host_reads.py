"""A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``: fail on every Python-level read of a tensor's
value (``item``, ``bool``, ``float``, ``int``, ``tolist``, ``numpy``, ``cpu``).

On a GPU each of these waits for the device; on the CPU they are free, so a CPU run cannot notice one slipping into
the update path. Wrapping the update path in :func:`forbid_host_reads` makes it fail there on the CPU too. It sees
Python calls only: reads inside torch's C++ (``nonzero``, boolean-mask indexing) and ``.to("cpu")`` (torch itself
calls ``.to(device)`` with a tensor's own device, a no-op there) are what the CUDA tests' sync debug mode catches.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__array__")


class HostReadError(AssertionError):
    """A tensor value was read back to the host where no read is allowed."""


@contextlib.contextmanager
def forbid_host_reads(where: str = "the update path") -> Iterator[None]:
    """Within the block, a tensor value read by Python raises :class:`HostReadError` naming the method."""
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def refuse(name: str) -> Callable[..., Any]:
        def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            raise HostReadError(f"Tensor.{name}() read a value back to the host in {where}")
        return method

    try:
        for name in READS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.Tensor, name, value)


def without_host_reads(fn: Callable[..., Any], where: str) -> Callable[..., Any]:
    """``fn`` run inside :func:`forbid_host_reads` at every call."""
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with forbid_host_reads(where):
            return fn(*args, **kwargs)
    return wrapped
