"""Typed configs with dotted ``key=value`` overrides. Every recipe declares a nested dataclass config; the command
line takes TorchRL-style dotted overrides (``python recipes/sac.py env.id=Hopper-v5 optim.lr=3e-4``). Unknown keys,
wrong types and values out of a field's declared range are errors that name the full dotted key (an unknown one
with the nearest valid key), before any env starts. ``--help`` lists every field with its type and range, default
and the string literal under it (CleanRL style).

The sections every recipe has live here, so common keys are spelled the same everywhere (``env.id``,
``collector.batch_B``, ``run.seed``...); a recipe changes their defaults with ``field(default_factory=lambda:
CollectorConfig(batch_B=1))``. Every numeric field declares its valid range in its type (``lr: PositiveFloat``,
``Annotated[int, Range(ge=-1)]``; lists: each item, and ``Length`` for the list), checked whenever a value is set or
a config validated and shown in ``--help``. A section may define ``validate(self)`` raising :class:`ConfigError` for
values that cannot work together; :func:`apply_overrides` calls it after every override is in. This module imports
nothing heavy, so a recipe that imports only it at the top (torch, TorchRL and tdrl's other layers inside ``main``)
and ends with ``run_recipe(main, Config(), doc=__doc__)`` reports a bad key or value in well under a second.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import difflib
import inspect
import json
import os
import sys
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from tdrl.utils.errors import UserError
from tdrl.utils.interrupt import interrupts_end_in_one_line
from tdrl.utils.ranges import Length, Range

__all__ = ["AnyFloat", "AtariEnvConfig", "CheckpointConfig", "CollectorConfig", "ConfigError", "Count", "EnvConfig",
           "EpsilonGreedyConfig", "EvalConfig", "Fraction", "LayerSizes", "Length", "LoggerConfig", "NonNegativeFloat",
           "NonNegativeInt", "PositiveFloat", "PositiveFraction", "Range", "RecipeConfig", "ReplayDevice", "RunConfig",
           "TrainerConfig", "UserError", "apply_overrides", "check_devices", "config_help", "diff_configs", "flatten",
           "merge_nested", "parse_args", "replay_copy", "run_recipe", "to_dict", "user_errors", "validate"]

C = TypeVar("C")

# --- Ranges: every int or float field of a config declares one (tests/test_config.py walks the recipes) --------

AnyFloat = Annotated[float, Range()]
"""Any number, on purpose (a return threshold, a log-std, an atom's value)."""
PositiveFloat = Annotated[float, Range(gt=0)]
"""> 0: learning rates, optimizer epsilons, clip ranges, scales."""
NonNegativeFloat = Annotated[float, Range(ge=0)]
""">= 0: loss coefficients, noise levels, exponents."""
Fraction = Annotated[float, Range(ge=0, le=1)]
"""In [0, 1]: probabilities, epsilons, GAE lambda, importance exponents."""
PositiveFraction = Annotated[float, Range(gt=0, le=1)]
"""In (0, 1]: discounts, polyak factors."""
Count = Annotated[int, Range(ge=1)]
""">= 1: sizes, counts, intervals."""
NonNegativeInt = Annotated[int, Range(ge=0)]
""">= 0: seeds, frame counts where 0 means none or off."""
LayerSizes = Annotated[list[Count], Length(1)]
"""Hidden layer widths: at least one layer, each >= 1."""


class ConfigError(UserError):
    """A config key or value is invalid; the message names the dotted key."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


ReplayDevice = Literal["auto", "cpu", "cuda"]
"""``replay.device``: where an off-policy recipe gathers its samples (see :func:`replay_copy`)."""


def check_devices(cfg: Any) -> None:
    """Raise :class:`ConfigError` for device settings that cannot work (a recipe's ``Config.validate`` calls this, so
    the launch fails before torch loads): ``optim.cudagraphs=true`` without ``run.device=cuda`` (a CUDA graph replays
    GPU work; on the CPU it would silently do nothing), ``replay.device=cuda`` without ``run.device=cuda`` or with
    ``trainer.kind=async`` (the GPU copy follows the writes of this process)."""
    cuda = cfg.run.device.partition(":")[0] == "cuda"
    _check(not cfg.optim.cudagraphs or cuda, f"optim.cudagraphs=true replays CUDA graphs, but run.device="
           f"{cfg.run.device!r}; set run.device=cuda or optim.cudagraphs=false")
    replay = cfg.replay.device
    _check(replay != "cuda" or cuda, f"replay.device=cuda keeps a copy of the replay on the GPU, but run.device="
           f"{cfg.run.device!r}; set run.device=cuda or replay.device=cpu")
    kind = getattr(getattr(cfg, "trainer", None), "kind", "sync")
    _check(replay != "cuda" or kind == "sync", f"replay.device=cuda needs trainer.kind=sync (the GPU copy follows "
           f"the writes of the learner's process); trainer.kind={kind}")


def replay_copy(cfg: Any) -> bool | None:
    """``copy_on_device`` of a ``TransitionReplayBuffer`` for ``replay.device``: ``cuda`` copies the stored data to
    ``run.device`` and gathers samples there, ``cpu`` gathers them in host memory and copies each over (pinned,
    non-blocking), ``auto`` copies (``None``: the buffer decides) when ``run.device`` is a GPU with room for the
    data in a quarter of its memory, under the sync trainer only."""
    kind = getattr(getattr(cfg, "trainer", None), "kind", "sync")
    return {"cuda": True, "cpu": False, "auto": None if kind == "sync" else False}[cfg.replay.device]


# --- Shared sections -------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """The training environment."""

    id: str = "CartPole-v1"
    """Gymnasium id (classic control, MuJoCo ``HalfCheetah-v5``, Atari ``ALE/Pong-v5``)."""


@dataclass
class AtariEnvConfig(EnvConfig):
    """The training environment of a recipe that plays Atari games (DQN, R2D1); evaluation plays whole games."""

    episodic_lives: bool = False
    """Atari: a lost life ends the RL episode (agent reset, no bootstrap), the game goes on (rlpyt: True)."""


@dataclass
class CollectorConfig:
    """The training collector and the run's budget."""

    kind: Literal["serial", "parallel", "action_server"] = "serial"
    """serial (one process), parallel (CPU workers), action_server (workers step, main process acts)."""
    n_workers: Count = 2
    """Worker processes of the parallel/action_server collectors (must divide batch_B)."""
    batch_B: Count = 8
    """Environments stepped together (rlpyt batch_B; the batch's first dim)."""
    batch_T: Count = 32
    """Time steps per env per iteration (rlpyt batch_T; the batch's second dim)."""
    total_frames: Count = 100_000
    """Env frames to train for, at least (rlpyt n_steps): ceil(total_frames / frames per iteration) iterations
    (batch_B * batch_T frames, times the ranks with trainer.kind=ddp), rounded up to whole log intervals."""

    def validate(self) -> None:
        _check(self.kind == "serial" or self.batch_B % self.n_workers == 0,
               f"collector.batch_B={self.batch_B} must be divisible by collector.n_workers={self.n_workers} (each "
               f"{self.kind} worker steps the same number of envs)")


@dataclass
class EpsilonGreedyConfig:
    """Epsilon-greedy exploration of the value-based recipes (DQN, R2D1); each re-declares it with its defaults."""

    eps_init: Fraction = 1.0
    """Epsilon until optim.min_steps_learn frames."""
    eps_final: Fraction = 0.04
    """Final epsilon (the largest per-env final value with vector epsilon)."""
    eps_final_min: PositiveFraction | None = None
    """Smallest per-env final epsilon, log-spaced over the envs (rlpyt's and Ape-X's vector epsilon); None: one
    epsilon for all envs."""
    eps_steps: NonNegativeInt = 9_000
    """Env frames at which epsilon reaches its final value (rlpyt eps_steps)."""
    eps_eval: Fraction = 0.001
    """Epsilon of evaluation episodes (rlpyt eps_eval)."""
    actor_eps: PositiveFraction = 0.4
    """trainer.kind=ray: actor i of N explores with the fixed actor_eps ** (1 + actor_eps_alpha * i / (N - 1))
    (Ape-X's schedule)."""
    actor_eps_alpha: NonNegativeFloat = 7.0
    """trainer.kind=ray: exponent spread of the actors' epsilons (Ape-X: 7)."""

    def validate(self) -> None:
        _check(self.eps_final_min is None or self.eps_final_min <= self.eps_final,
               f"exploration.eps_final_min={self.eps_final_min} must be <= exploration.eps_final={self.eps_final} "
               "(the per-env final epsilons are log-spaced between them)")


@dataclass
class EvalConfig:
    """Offline evaluation (rlpyt MinibatchRlEval): whole greedy episodes on dedicated envs."""

    n_envs: NonNegativeInt = 10
    """Evaluation episodes at iteration 0 and every log interval; 0 logs online training episodes instead."""
    max_steps: NonNegativeInt = 0
    """Time limit of evaluation episodes; 0 uses the env's own (1000 if it has none)."""
    video: bool = False
    """Record one greedy episode per evaluation as ``videos/video_<frames>.mp4`` in the run directory (and W&B)."""

    def validate(self) -> None:
        _check(not self.video or self.n_envs >= 1, "eval.video=true records an evaluation episode, so it needs "
               "eval.n_envs >= 1")


@dataclass
class RunConfig:
    """Where a run lives and how it is seeded. Common to every recipe."""

    root: str = "runs"
    """Directory under which run directories are created (``<root>/<date>/<time>_<name>/run_<seed>``)."""
    dir: str = ""
    """This run's directory, explicitly. Launching again with the same ``run.dir`` resumes the run there."""
    name: str = ""
    """Run name used in the directory and W&B; empty means the recipe's name."""
    seed: NonNegativeInt = 0
    """Seed for python, numpy, torch and the environments."""
    device: str = "cpu"
    """Device of the learner (``cpu``, ``cuda``, ``cuda:1``)."""
    torch_threads: Count = 1
    """torch intra-op threads of the main process (small nets on few cores are fastest with 1)."""
    force: bool = False
    """Resume even if the saved config differs from this one; start over when none of the run directory's
    checkpoints loads (without it that launch stops and changes nothing)."""

    def validate(self) -> None:
        kind, _, index = self.device.partition(":")
        _check(kind in ("cpu", "cuda", "mps") and (not index or index.isdigit()),
               f"run.device={self.device!r} is not a device; use cpu, cuda, cuda:<index> or mps")


@dataclass
class LoggerConfig:
    """Metric sinks: console, progress.csv, W&B."""

    log_interval_steps: Count = 10_000
    """Env frames between log rows and evaluations (rlpyt's ``log_interval_steps``), rounded down to whole
    iterations (at least one)."""
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
    snapshot_gap: Count = 10
    """Iterations between kept checkpoints in ``gap`` modes."""
    interval_steps: NonNegativeInt = 0
    """Env frames between checkpoints; 0 means at every log interval."""
    strict_resume: bool = False
    """Fail on a corrupt latest checkpoint instead of falling back to the previous valid one."""


@dataclass
class TrainerConfig:
    """Which trainer runs the recipe's loop, and its process settings (:func:`tdrl.train.make_trainer`)."""

    kind: Literal["sync", "ddp", "async", "ray"] = "sync"
    """sync: collect, then update, in one process (rlpyt MinibatchRl); ddp: world_size full replicas, gradients
    all-reduced (rlpyt SyncRl); async: collector process + optimizer process on a shared replay (rlpyt AsyncRl,
    off-policy only); ray: n_actors collector actors anywhere in a Ray cluster, the learner here (Ape-X with a
    replay, IMPALA without)."""
    world_size: Count = 2
    """ddp: number of ranks (local processes; under torchrun/SLURM it must equal WORLD_SIZE)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """ddp: torch.distributed backend; auto = NCCL on CUDA devices, gloo on CPU."""
    max_lag_frames: Annotated[int, Range(ge=-1)] = 0
    """async, ray: frames the collectors may run ahead of the optimizer beyond one batch each (0: they collect the
    next batch while the last one trains, so the replay ratio holds); -1: no limit (rlpyt's AsyncRl, Ape-X's
    actors: full speed, fewer updates per frame when the optimizer is slower)."""
    updates_per_sync: Count = 1
    """async, ray: gradient updates between weight publications to the collectors."""
    n_actors: Count = 4
    """ray: collector actors (each builds the recipe's collector, with its own seed)."""
    ray_address: str = ""
    """ray: the cluster to join (host:port); empty: RAY_ADDRESS if set, else Ray starts on this machine."""
    actor_cpus: PositiveFloat = 1.0
    """ray: CPUs each collector actor reserves in the cluster."""
    call_timeout_s: PositiveFloat = 60.0
    """ray: a rollout or hub call taking longer has its actor killed and restarted (a lost node)."""
    unrolls_per_batch: Count = 1
    """ray, on-policy (IMPALA): actors' unrolls concatenated into one learner batch."""


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
    stop_return: AnyFloat | None = None
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
    """Field name -> resolved type hint (with its ``Annotated`` range)."""
    hints = typing.get_type_hints(cls, include_extras=True)
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
    """Convert ``value`` (a CLI string or a python value) to type ``tp`` and check its declared range, or raise
    naming ``key`` (a list's item as ``key[i]``)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is Annotated:
        out = _coerce(key, value, args[0])
        for bound in args[1:]:
            if isinstance(bound, (Range, Length)) and (problem := bound.violation(out)) is not None:
                raise ConfigError(f"config key '{key}': {problem}")
        return out
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        arms = [arg for arg in args if arg is not type(None)]
        if len(arms) == 1:  # its own error says what is wrong (the type or the range)
            return _coerce(key, value, arms[0])
        for arg in arms:
            with contextlib.suppress(ConfigError):
                return _coerce(key, value, arg)
        raise ConfigError(f"config key '{key}': {value!r} does not fit {_type_name(tp)}")
    if origin is Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and str(choice) == value):
                return choice
        raise ConfigError(f"config key '{key}': {value!r} is not one of {list(args)}")
    if origin in (list, tuple):
        item_tp = args[0] if args else Any
        out = [_coerce(f"{key}[{i}]", item, item_tp) for i, item in enumerate(_list_items(key, value))]
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


def _list_items(key: str, value: Any) -> list[Any]:
    """The items of a list value: a python list or tuple, or a string ``[a, b]``, ``(a, b)`` or ``a, b`` with
    balanced brackets and no empty item (``[]`` is the empty list), so a typo cannot drop an item silently."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if not isinstance(value, str):
        raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
    text = value.strip()
    if text[:1] in ("[", "(") and text[-1:] == {"[": "]", "(": ")"}[text[0]]:
        text = text[1:-1].strip()
        if not text:
            return []
    items = [item.strip() for item in text.split(",")]
    if any(not item or any(c in item for c in "[]()") for item in items):
        raise ConfigError(f"config key '{key}': {value!r} is not a list; write it as [64, 64] (balanced brackets, "
                          "no empty item; [] is the empty list)")
    return items


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
    validate(out)
    return out


def validate(cfg: Any, prefix: str = "") -> None:
    """Check every field's value against its type and declared range, as an override is checked (so a default or a
    value set in code cannot skip it), then call ``validate()`` on every section that has one (after all overrides,
    so checks may relate fields). Raises :class:`ConfigError` naming the dotted key (``prefix`` + field)."""
    for name, tp in _fields(type(cfg)).items():
        if dataclasses.is_dataclass(value := getattr(cfg, name)):
            validate(value, f"{prefix}{name}.")
        else:
            _coerce(f"{prefix}{name}", value, tp)
    if callable(check := getattr(cfg, "validate", None)):
        check()


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
    """How ``--help`` shows a type: ``float > 0``, ``non-empty list[int >= 1]``, ``float in (0, 1] or None``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "{" + ",".join(str(a) for a in args) + "}"
    if origin is Annotated:
        name = _type_name(args[0])
        for bound in args[1:]:
            if isinstance(bound, Range) and str(bound):
                name = f"{name} {bound}"
            elif isinstance(bound, Length):
                name = f"{bound} {name}"
        return name
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin in (list, tuple):
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else _type_name(a) for a in args)}]"
    if tp is type(None):
        return "None"
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
    with user_errors():
        return apply_overrides(cfg, [a.lstrip("-") for a in argv])


@contextlib.contextmanager
def user_errors():
    """Turn a :class:`UserError` into one line ``error: ...`` on stderr and exit status 2; ``TDRL_DEBUG=1`` keeps
    the traceback."""
    try:
        yield
    except UserError as e:
        if os.environ.get("TDRL_DEBUG", "") not in ("", "0"):
            raise
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(2) from None


def run_recipe(main: typing.Callable[[C], Any], cfg: C, *, prog: str | None = None, doc: str = "",
               argv: list[str] | None = None) -> Any:
    """A recipe's command line: ``main(parse_args(cfg, argv, prog, doc))``, where bad input (any
    :class:`UserError`: a config value, an env id, an algorithm the env does not fit, a resource this machine lacks)
    ends with one line and exit status 2. A recipe imports only this module at the top and the heavy modules (torch,
    TorchRL, envs) inside ``main``, so a config error shows in well under a second. Ctrl-C and SIGTERM end with one
    line giving the command that resumes the run, and exit status 130 / 143 (:mod:`tdrl.utils.interrupt`)."""
    script = sys.argv[0] if argv is None else (prog or sys.argv[0])  # as the user typed it
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(cfg, argv, prog, doc)
    with interrupts_end_in_one_line(script, argv), user_errors():
        return main(cfg)
