"""Loading a Python file by path as a module: recipes (the launcher, SLURM jobs), a data-parallel rank's caller."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_module"]


def load_module(name: str, path: str | Path) -> ModuleType:
    """Execute the file at ``path`` as module ``name``, registered in ``sys.modules`` first (dataclasses resolve
    string annotations through it, and pickle finds its functions there); unregistered again if it fails.

    Raises:
        ImportError: ``path`` is not a Python source file; whatever the file raises while it runs.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"'{path}' cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
