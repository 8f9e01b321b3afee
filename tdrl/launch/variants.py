"""Hyperparameter variants with rlpyt's semantics: levels of (keys, values, dir names) crossed in order.

A level lists complete value combinations for a few keys, each with a directory name, so keys can be tied
together instead of taking their product::

    lr = VariantLevel(keys=["optim.lr"], values=[[3e-4], [1e-3]], dir_names=["lr3e-4", "lr1e-3"])
    env = VariantLevel(keys=[("env", "id"), "collector.frames_per_batch"],
                       values=[["CartPole-v1", 1000], ["Acrobot-v1", 2000]], dir_names=["cartpole", "acrobot"])
    variants, log_dirs = make_variants(lr, env)   # ["lr3e-4/cartpole", "lr3e-4/acrobot", "lr1e-3/cartpole", ...]

A variant is a nested dict (``{"optim": {"lr": 3e-4}}``), merged strictly into a recipe's dataclass config
(:func:`tdrl.config.merge_nested` raises :class:`tdrl.config.ConfigError` naming any key the config lacks).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from tdrl.utils.files import write_json_atomic

__all__ = ["VariantLevel", "load_variant", "make_variants", "save_variant"]

VARIANT_FILE = "variant.json"
_SAFE_DIR = re.compile(r"^[A-Za-z0-9._=+\-]+(/[A-Za-z0-9._=+\-]+)*$")


class VariantLevel(NamedTuple):
    """One level of a sweep: every entry of ``values`` is a full combination for ``keys``.

    Attributes:
        keys: config keys, each a dotted string (``"optim.lr"``) or a tuple of nested names (``("optim", "lr")``).
        values: one list per combination, with one value per key in ``keys`` order.
        dir_names: one directory name per combination; joined across levels into each variant's log directory.
    """

    keys: Sequence[str | tuple[str, ...]]
    values: Sequence[Sequence[Any]]
    dir_names: Sequence[str]


def _key_path(key: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    parts = tuple(key.split(".")) if isinstance(key, str) else tuple(key)
    if not parts or not all(isinstance(p, str) and p for p in parts):
        raise ValueError(f"variant key {key!r} must be a dotted string or a tuple of names")
    return parts


def _check_level(index: int, level: VariantLevel) -> list[tuple[str, ...]]:
    keys = [_key_path(k) for k in level.keys]
    where = f"VariantLevel {index} (keys {['.'.join(k) for k in keys]})"
    if len(set(keys)) != len(keys):
        raise ValueError(f"{where}: a key appears twice")
    if len(level.values) != len(level.dir_names):
        raise ValueError(f"{where}: {len(level.values)} value sets but {len(level.dir_names)} dir_names")
    if not level.values:
        raise ValueError(f"{where}: no values")
    for i, combo in enumerate(level.values):
        if isinstance(combo, (str, bytes)) or not isinstance(combo, Sequence) or len(combo) != len(keys):
            raise ValueError(f"{where}: values[{i}] = {combo!r} must be a list with one value per key ({len(keys)})")
    for name in level.dir_names:
        if not isinstance(name, str) or not _SAFE_DIR.match(name) or ".." in name.split("/"):
            raise ValueError(f"{where}: dir name {name!r} must be a relative path of letters, digits, ._=+-")
    if len(set(level.dir_names)) != len(level.dir_names):
        raise ValueError(f"{where}: dir_names are not unique: {list(level.dir_names)}")
    return keys


def _set_nested(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        node = tree.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"variant key {'.'.join(path)!r} goes below the value set for {part!r}")
        tree = node
    if isinstance(tree.get(path[-1]), dict):
        raise ValueError(f"variant key {'.'.join(path)!r} is a section already set by deeper keys")
    tree[path[-1]] = value


def make_variants(*levels: VariantLevel) -> tuple[list[dict[str, Any]], list[str]]:
    """Cross the levels in order (rlpyt): every combination of one level with every one of the next.

    Returns:
        ``(variants, log_dirs)``: nested variant dicts and their relative log directories (dir names joined with
        ``/``), in the order of the crossing: the first level varies slowest. With no level, one empty variant
        with log dir ``""``.

    Raises:
        ValueError: a malformed level, or the same key set by two levels (the later would silently win).
    """
    variants: list[dict[str, Any]] = [{}]
    log_dirs: list[str] = [""]
    seen: dict[tuple[str, ...], int] = {}
    for index, level in enumerate(levels):
        keys = _check_level(index, level)
        for key in keys:
            if key in seen:
                raise ValueError(f"variant key {'.'.join(key)!r} is set by levels {seen[key]} and {index}")
            seen[key] = index
        crossed, crossed_dirs = [], []
        for variant, log_dir in zip(variants, log_dirs, strict=True):
            for combo, name in zip(level.values, level.dir_names, strict=True):
                new = json.loads(json.dumps(variant))  # deep copy of plain data
                for key, value in zip(keys, combo, strict=True):
                    _set_nested(new, key, value)
                crossed.append(new)
                crossed_dirs.append(f"{log_dir}/{name}" if log_dir else name)
        variants, log_dirs = crossed, crossed_dirs
    return variants, log_dirs


def save_variant(variant: dict[str, Any], log_dir: str | os.PathLike) -> Path:
    """Write ``variant.json`` into ``log_dir`` (created if needed) atomically; returns its path."""
    path = Path(log_dir) / VARIANT_FILE
    write_json_atomic(path, variant)
    return path


def load_variant(log_dir: str | os.PathLike) -> dict[str, Any]:
    """Read the ``variant.json`` that :func:`save_variant` wrote into ``log_dir``."""
    return json.loads((Path(log_dir) / VARIANT_FILE).read_text())
