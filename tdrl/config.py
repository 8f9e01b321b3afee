"""Typed configs with dotted ``key=value`` overrides. Every recipe declares a nested dataclass config; the command
line takes TorchRL-style dotted overrides (``python recipes/sac.py env.id=Hopper-v5 optim.lr=3e-4``). Unknown keys
and wrong types are errors that name the full dotted key and suggest the nearest one, before any env starts.
``--help`` lists every field with its type, default and the string literal under it (CleanRL style).

The sections every recipe has live here, so common keys are spelled the same everywhere (``env.id``,
``collector.batch_B``, ``run.seed``...); a recipe changes their defaults with ``field(default_factory=lambda:
CollectorConfig(batch_B=1))`` and validates what it does not support itself, naming the key.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import difflib
import inspect
import json
import sys
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

__all__ = ["CheckpointConfig", "CollectorConfig", "ConfigError", "EnvConfig", "EvalConfig", "LoggerConfig",
           "RecipeConfig", "RunConfig", "apply_overrides", "config_help", "diff_configs", "flatten", "merge_nested",
           "parse_args", "to_dict"]

C = TypeVar("C")


class ConfigError(ValueError):
    """A config key or value is invalid; the message names the dotted key."""


# --- Shared sections -------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """The training environment."""

    id: str = "CartPole-v1"
    """Gymnasium id (classic control, MuJoCo ``HalfCheetah-v5``, Atari ``ALE/Pong-v5``)."""


@dataclass
class CollectorConfig:
    """The training collector and the run's budget."""

    kind: Literal["serial", "parallel", "action_server"] = "serial"
    """serial (one process), parallel (CPU workers), action_server (workers step, main process acts)."""
    n_workers: int = 2
    """Worker processes of the parallel/action_server collectors (must divide batch_B)."""
    batch_B: int = 8
    """Environments stepped together (rlpyt batch_B; the batch's first dim)."""
    batch_T: int = 32
    """Time steps per env per iteration (rlpyt batch_T; the batch's second dim)."""
    total_frames: int = 100_000
    """Env frames to train for (rlpyt n_steps; rounded up to a whole log interval)."""


@dataclass
class EvalConfig:
    """Offline evaluation (rlpyt MinibatchRlEval): whole greedy episodes on dedicated envs."""

    n_envs: int = 10
    """Evaluation episodes at iteration 0 and every log interval; 0 logs online training episodes instead."""
    max_steps: int = 0
    """Time limit of evaluation episodes; 0 uses the env's own (1000 if it has none)."""


@dataclass
class RunConfig:
    """Where a run lives and how it is seeded. Common to every recipe."""

    root: str = "runs"
    """Directory under which run directories are created (``<root>/<date>/<time>_<name>/run_<seed>``)."""
    dir: str = ""
    """This run's directory, explicitly. Launching again with the same ``run.dir`` resumes the run there."""
    name: str = ""
    """Run name used in the directory and W&B; empty means the recipe's name."""
    seed: int = 0
    """Seed for python, numpy, torch and the environments."""
    device: str = "cpu"
    """Device of the learner (``cpu``, ``cuda``, ``cuda:1``)."""
    torch_threads: int = 1
    """torch intra-op threads of the main process (small nets on few cores are fastest with 1)."""
    force: bool = False
    """Resume even if the saved config differs from this one; start over when none of the run directory's
    checkpoints loads (without it that launch stops and changes nothing)."""


@dataclass
class LoggerConfig:
    """Metric sinks: console, progress.csv, W&B."""

    log_interval_steps: int = 10_000
    """Env frames between log rows (rlpyt's ``log_interval_steps``)."""
    wandb: bool = True
    """Mirror metrics to Weights & Biases (the run directory stays the source of truth)."""
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    """W&B mode; offline needs no account (``wandb sync`` later)."""
    project: str = "tdrl"
    """W&B project."""
    entity: str = ""
    """W&B entity (team or user); empty means the default."""
    group: str = ""
    """W&B group, e.g. the sweep or experiment name."""
    tensorboard: bool = False
    """Also write TensorBoard event files."""
    progress_bar: bool = True
    """Show a tqdm progress bar (it turns itself off when stderr is not a terminal)."""


@dataclass
class CheckpointConfig:
    """Snapshots (rlpyt's snapshot modes) and resume."""

    snapshot_mode: Literal["none", "last", "all", "gap", "gap_and_last"] = "last"
    """Which checkpoints to keep: none, the last two (the one before the newest survives a bad newest), all, every
    ``snapshot_gap`` iterations, or those multiples plus the last two."""
    snapshot_gap: int = 10
    """Iterations between kept checkpoints in ``gap`` modes."""
    interval_steps: int = 0
    """Env frames between checkpoints; 0 means at every log interval."""
    strict_resume: bool = False
    """Fail on a corrupt latest checkpoint instead of falling back to the previous valid one."""


# --- Conversion ------------------------------------------------------------------------------------------


@dataclass
class RecipeConfig:
    """The sections every recipe has. A recipe's ``Config`` subclasses it, adds its algorithm's sections (model,
    loss, optim, ...) and re-declares a section to change its defaults."""

    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment."""
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    """Training collector and budget."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Offline evaluation (rlpyt MinibatchRlEval)."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run directory, seed, device."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Logging cadence and sinks."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Snapshots and resume."""
    stop_return: float | None = None
    """Stop once the evaluation return reaches this (benchmarks); None trains the whole budget."""


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict (JSON-serialisable) of a dataclass config."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def flatten(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for key, value in nested.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def merge_nested(cfg: C, nested: dict[str, Any]) -> C:
    """A copy of ``cfg`` with a nested dict's values merged in, strictly as :func:`apply_overrides` (rlpyt's
    ``update_config``)."""
    return apply_overrides(cfg, flatten(nested))


def diff_configs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two nested config dicts: ``{key: (a_value, b_value)}``."""
    fa, fb = flatten(a), flatten(b)
    missing = object()
    pairs = {k: (fa.get(k, missing), fb.get(k, missing)) for k in sorted(set(fa) | set(fb))}
    return {k: (va, vb) for k, (va, vb) in pairs.items() if va != vb}


# --- Overrides -------------------------------------------------------------------------------------------


def _fields(cls: type) -> dict[str, Any]:
    """Field name -> resolved type hint."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _all_keys(cfg: Any, prefix: str = "") -> list[str]:
    keys = []
    for name in _fields(type(cfg)):
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            keys.extend(_all_keys(value, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _unknown_key(key: str, cfg: Any) -> ConfigError:
    valid = _all_keys(cfg)
    near = [k for k in valid if k.lower() == key.lower()]  # batch_b -> batch_B, before any fuzzy match
    near = near or difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if not near:  # try matching the last component only, e.g. 'lrr' -> 'optim.lr'
        tails = {k.rsplit(".", 1)[-1]: k for k in valid}
        hit = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(tails), n=1, cutoff=0.6)
        near = [tails[hit[0]]] if hit else []
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return ConfigError(f"unknown config key '{key}'{hint} (see --help for all keys)")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert ``value`` (a CLI string or a python value) to type ``tp`` or raise naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        for arg in args:
            if arg is not type(None):
                with contextlib.suppress(ConfigError):
                    return _coerce(key, value, arg)
        raise ConfigError(f"config key '{key}': {value!r} does not fit {tp}")
    if origin is Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and str(choice) == value):
                return choice
        raise ConfigError(f"config key '{key}': {value!r} is not one of {list(args)}")
    if origin in (list, tuple):
        if isinstance(value, str):
            text = value.strip()
            if text.startswith(("[", "(")):
                text = text[1:-1]
            items = [s.strip() for s in text.split(",") if s.strip()]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        item_tp = args[0] if args else Any
        out = [_coerce(key, v, item_tp) for v in items]
        return tuple(out) if origin is tuple else out
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"config key '{key}': expected a bool (true/false), got {value!r}")
    if tp in (int, float) and not isinstance(value, bool):
        if tp is int and isinstance(value, int):
            return value
        with contextlib.suppress(TypeError, ValueError):  # strings accept 1e6 and 1_000_000
            number = float(value.replace("_", "") if isinstance(value, str) else value)
            if tp is float or number.is_integer():
                return tp(number)
    if tp in (int, float):
        raise ConfigError(f"config key '{key}': expected {'an int' if tp is int else 'a float'}, got {value!r}")
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"config key '{key}': unsupported field type {tp}")


def apply_overrides(cfg: C, overrides: dict[str, Any] | list[str]) -> C:
    """A copy of ``cfg`` with dotted overrides, ``{"optim.lr": 3e-4}`` or ``["optim.lr=3e-4"]``, applied (strings
    are converted to the field's type).

    Raises:
        ConfigError: unknown key (with the nearest valid key) or a value that does not fit the field's type.
    """
    if isinstance(overrides, list):
        if bad := [item for item in overrides if "=" not in item]:
            raise ConfigError(f"override {bad[0]!r} is not of the form key=value")
        overrides = {key.strip(): value for key, value in (item.split("=", 1) for item in overrides)}
    out = copy.deepcopy(cfg)
    for key, value in overrides.items():
        node, parts = out, key.split(".")
        for i, part in enumerate(parts):
            fields = _fields(type(node))
            if part not in fields:
                raise _unknown_key(key, cfg)
            tp = fields[part]
            current = getattr(node, part)
            if i < len(parts) - 1:
                if not dataclasses.is_dataclass(current):
                    raise _unknown_key(key, cfg)
                node = current
            elif dataclasses.is_dataclass(current):
                if not isinstance(value, dict):
                    raise ConfigError(f"config key '{key}' is a section; set its fields ({key}.<field>=...)")
                setattr(node, part, merge_nested(current, value))
            else:
                setattr(node, part, _coerce(key, value, tp))
    return out


# --- Help and CLI ----------------------------------------------------------------------------------------


def _field_docs(cls: type) -> dict[str, str]:
    """The string literal written under each field of a dataclass and its dataclass bases (attribute docstrings;
    a subclass's own text wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)
        if is_doc and isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(tp)) + "}"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def config_help(cfg: Any, prefix: str = "") -> str:
    """One line per field: ``key (type) = default  doc``."""
    lines = []
    docs = _field_docs(type(cfg))
    for name, tp in _fields(type(cfg)).items():
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            lines.append(f"\n[{prefix}{name}] {docs.get(name, '')}".rstrip())
            lines.append(config_help(value, f"{prefix}{name}."))
        else:
            lines.append(f"  {prefix}{name} ({_type_name(tp)}) = {value!r}  {docs.get(name, '')}".rstrip())
    return "\n".join(lines)


def parse_args(cfg: C, argv: list[str] | None = None, prog: str | None = None, doc: str = "") -> C:
    """Parse ``key=value`` overrides from ``argv`` onto ``cfg``. ``--help`` prints every key and exits; a bad key or
    value prints the error and exits with status 2 (before anything is built)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(f"usage: {prog or sys.argv[0]} [key=value ...]\n")
        if doc:
            print(doc.strip() + "\n")
        print(config_help(cfg))
        raise SystemExit(0)
    try:
        return apply_overrides(cfg, [a.lstrip("-") for a in argv])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
