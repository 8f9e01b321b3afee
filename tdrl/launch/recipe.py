"""Load a recipe file (``recipes/<name>.py``: a dataclass ``Config`` and ``main(cfg) -> dict``) by path.

The launcher loads it to validate a sweep against ``Config`` before anything is submitted, and a SLURM job loads
it to call ``main`` in-process (so submitit's preemption handler lives in the process that trains). tdrl never
imports ``recipes/`` statically; this loads a file the user names, without running its ``__main__`` block.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import sys
import types
from pathlib import Path

from tdrl.utils.scripts import load_module

__all__ = ["RecipeError", "load_recipe", "resolve_recipe"]


class RecipeError(ValueError):
    """A recipe path that does not exist, or a module that is not a recipe; the message says which."""


def resolve_recipe(recipe: str, search_from: list[Path] | None = None) -> Path:
    """Absolute path of ``recipe``: as given, else relative to the working directory or to any of
    ``search_from`` and their parents (sweep files name recipes relative to the repository: ``recipes/ppo.py``).

    Raises:
        RecipeError: no such file, with the nearest recipe names in the directory it should be in.
    """
    path = Path(recipe).expanduser()
    candidates = [Path.cwd() / path]  # an absolute path stays itself
    if not path.is_absolute():
        for base in map(Path.resolve, search_from or []):
            candidates += [parent / path for parent in [base, *base.parents]]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    folders = {c.parent for c in candidates if c.parent.is_dir()}
    names = sorted({p.name for d in folders for p in d.glob("*.py") if not p.name.startswith("_")})
    near = difflib.get_close_matches(path.name, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    if names and not near:
        hint = f"; recipes there: {', '.join(names)}"
    raise RecipeError(f"unknown recipe '{recipe}': no such file{hint}")


def _importable_elsewhere(name: str, path: Path) -> bool:
    """True when ``import name`` would find another module (stdlib or installed) than the recipe file."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and (spec.origin is None or Path(spec.origin).resolve() != path)


def load_recipe(path: str | Path) -> types.ModuleType:
    """Import the recipe file at ``path`` as a module (its ``__main__`` block does not run).

    The recipe's directory goes on ``sys.path`` first, as when it runs as a script, so it can import its
    siblings.

    Raises:
        RecipeError: the file does not import, or lacks a dataclass ``Config`` or a callable ``main``.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise RecipeError(f"unknown recipe '{path}': no such file")
    # Named after the file (``ppo``) with its folder on sys.path, as when run as a script, so functions defined
    # in the recipe pickle by reference into spawned worker processes; a hashed name only on a clash.
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and (file := getattr(loaded, "__file__", None)) and Path(file).resolve() == path:
        return loaded
    if loaded is not None or not name.isidentifier() or _importable_elsewhere(name, path):
        name = f"tdrl_recipe_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    try:
        module = load_module(name, path)
    except Exception as e:
        raise RecipeError(f"recipe '{path}' failed to import: {type(e).__name__}: {e}") from e
    config_cls = getattr(module, "Config", None)
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
        del sys.modules[name]
        raise RecipeError(f"recipe '{path}' has no dataclass 'Config'")
    if not callable(getattr(module, "main", None)):
        del sys.modules[name]
        raise RecipeError(f"recipe '{path}' has no 'main(cfg)' function")
    return module
