"""Sweeps: a recipe, variant levels, seeds and resources, planned into validated runs before anything starts.

A sweep file is a Python file (conventionally in ``slurm/sweeps/``, e.g. ``ppo_cartpole_lr.py``) that defines
``sweep = Sweep(name=..., recipe="recipes/ppo.py", levels=[VariantLevel(...)], seeds=[0, 1, 2], overrides={...},
resources=Resources(...))``. :func:`plan_sweep` crosses the levels with the seeds (rlpyt order: seeds outer,
variants inner, so the first runs to start cover every setting once) and builds every run's config with the
strict merge of :mod:`tdrl.config`: an unknown key, a wrong type or an unknown recipe raises here, naming it,
before a single run is launched. Each run lives in ``<root>/<sweep name>/<variant dirs>/run_<seed>/`` and is the
command ``python <recipe> key=value ... run.seed=<seed> run.dir=<that dir>``; launching it again resumes it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tdrl.config import ConfigError, apply_overrides, diff_configs, flatten, to_dict
from tdrl.launch.recipe import RecipeError, load_recipe, resolve_recipe
from tdrl.launch.variants import VariantLevel, make_variants

__all__ = ["Resources", "RunSpec", "Sweep", "SweepError", "SweepPlan", "load_sweep", "plan_sweep"]

_NAME = re.compile(r"^[A-Za-z0-9._\-]+$")


class SweepError(ValueError):
    """A sweep that cannot run as written; the message names the sweep, the run and the key."""


@dataclass
class Resources:
    """What one run needs, for the local slots and for SLURM (command-line flags override these)."""

    cpus_per_run: int = 1
    """Cores per run (per task when ``tasks_per_node > 1``): a local slot's size, SLURM ``--cpus-per-task``."""
    gpus_per_run: int = 0
    """GPUs per run: local slot GPUs, SLURM ``--gpus-per-node``."""
    runs_per_gpu: int = 1
    """Local only: runs sharing one GPU (rlpyt's ``contexts_per_gpu``)."""
    mem_gb: float | None = None
    """SLURM ``--mem`` per node in GB; None: the partition's default."""
    time_min: int = 60
    """SLURM time limit in minutes; the job checkpoints and requeues itself when it runs out."""
    partition: str | None = None
    """SLURM partition; None: the cluster's default."""
    array_parallelism: int | None = None
    """SLURM: at most this many runs of the job array at once (``--array=0-N%P``); None: no limit."""
    tasks_per_node: int = 1
    """SLURM tasks per node; > 1 for data-parallel runs (one process per rank, torch.distributed from SLURM)."""
    nodes: int = 1
    """SLURM nodes per run (one rank per task of each; see ``ray``)."""
    ray: bool = False
    """SLURM: run on a Ray cluster over the run's nodes, the recipe's driver on the first with ``RAY_ADDRESS`` set
    (on by itself for ``trainer.kind=ray``); one task per node."""
    signal_delay_s: int = 120
    """SLURM sends USR2 this long before the time limit, so the run can checkpoint and requeue."""
    max_requeues: int = 3
    """Requeues after time-outs before giving up (submitit's ``max_num_timeout``)."""
    slurm_setup: list[str] = field(default_factory=list)
    """Shell lines run in the job before the run (``module load ...``, ``source venv/bin/activate``)."""
    slurm_extra: dict[str, Any] = field(default_factory=dict)
    """Other ``#SBATCH`` options, e.g. ``{"qos": "high", "account": "rl"}``."""


@dataclass
class Sweep:
    """A grid of variants x seeds of one recipe (see the module docstring)."""

    name: str
    recipe: str
    levels: list[VariantLevel] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0])
    overrides: dict[str, Any] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    root: str = "runs/sweeps"
    """Parent of the experiment directory ``<root>/<name>``."""
    source: str = ""
    """The sweep file this came from (set by :func:`load_sweep`; recipe paths are searched from there)."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: a variant, a seed, a directory, and the command-line overrides that make it."""

    index: int
    log_dir: str
    seed: int
    variant: dict[str, Any]
    run_dir: Path
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        """``lr1e-3/cartpole/run_0`` (the run directory relative to the experiment directory)."""
        return f"{self.log_dir}/run_{self.seed}" if self.log_dir else f"run_{self.seed}"

    def command(self, recipe: Path, python: str | None = None) -> list[str]:
        """``[python, recipe, key=value, ...]``: this run as a process (``python``: default this interpreter)."""
        return [python or sys.executable, str(recipe), *self.overrides]

    def is_done(self) -> bool:
        """The run finished before: its ``summary.json`` exists."""
        return (self.run_dir / "summary.json").is_file()


@dataclass
class SweepPlan:
    """A validated sweep: the resolved recipe, the experiment directory and every run."""

    sweep: Sweep
    recipe: Path
    exp_dir: Path
    runs: list[RunSpec]

    def manifest(self, backend: str) -> dict[str, Any]:
        """The JSON record of this sweep written to ``<exp_dir>/sweep.json`` by the launchers."""
        return {
            "name": self.sweep.name, "recipe": str(self.recipe), "sweep_file": self.sweep.source, "backend": backend,
            "resources": dataclasses.asdict(self.sweep.resources),
            "runs": [{**dataclasses.asdict(r), "name": r.name, "run_dir": str(r.run_dir)} for r in self.runs],
        }


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Execute a sweep file and return its ``sweep`` object.

    Raises:
        SweepError: no such file, it fails to run, or it defines no ``sweep = Sweep(...)``.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise SweepError(f"no sweep file '{path}'")
    try:
        sweep = runpy.run_path(str(path)).get("sweep")
    except Exception as e:
        raise SweepError(f"sweep file '{path}' failed: {type(e).__name__}: {e}") from e
    if not isinstance(sweep, Sweep):
        raise SweepError(f"sweep file '{path}' must define 'sweep = Sweep(...)'")
    return dataclasses.replace(sweep, source=str(path))


def _run_overrides(
    sweep: Sweep, cfg_keys: set[str], log_dir: str, seed: int, variant: dict[str, Any], run_dir: Path
) -> dict[str, Any]:
    values: dict[str, Any] = flatten(dict(sweep.overrides))  # dotted keys or nested sections
    values.update(flatten(variant))
    if "logger.group" in cfg_keys and "logger.group" not in values:
        values["logger.group"] = sweep.name  # one W&B group per sweep
    if "run.name" in cfg_keys and "run.name" not in values:
        values["run.name"] = f"{sweep.name}-{log_dir.replace('/', '-')}-s{seed}" if log_dir else f"{sweep.name}-s{seed}"
    values["run.seed"] = seed
    values["run.dir"] = str(run_dir)
    return values


def _as_arg(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_as_arg(v) for v in value) + "]"
    return str(value)


def plan_sweep(sweep: Sweep, root: str | os.PathLike | None = None) -> SweepPlan:
    """Resolve the recipe, cross the variants with the seeds and validate every run's config.

    Args:
        sweep: the sweep.
        root: parent of the experiment directory (default ``sweep.root``).

    Raises:
        SweepError: unknown recipe, malformed levels or seeds, an unknown config key or a bad value in any run
            (the message names the run and the key, with the nearest valid key).
    """
    where = f"sweep '{sweep.name}'"
    _check_name_and_seeds(sweep, where)
    search = [Path(sweep.source).parent] if sweep.source else []
    try:
        recipe = resolve_recipe(sweep.recipe, search)
        module = load_recipe(recipe)
        variants, log_dirs = make_variants(*sweep.levels)
    except (RecipeError, ValueError) as e:
        raise SweepError(f"{where}: {e}") from e
    base = module.Config()
    cfg_keys = set(flatten(to_dict(base)))
    for key in ("run.dir", "run.seed"):
        if key not in cfg_keys:
            raise SweepError(f"{where}: recipe '{recipe}' Config has no '{key}' (use tdrl.config.RunConfig as 'run')")
    exp_dir = (Path(root if root is not None else sweep.root) / sweep.name).resolve()
    runs: list[RunSpec] = []
    for seed in sweep.seeds:  # rlpyt order: seeds outer, variants inner
        for variant, log_dir in zip(variants, log_dirs, strict=True):
            run_name = f"{log_dir}/run_{seed}" if log_dir else f"run_{seed}"
            run_dir = exp_dir / run_name
            values = _run_overrides(sweep, cfg_keys, log_dir, seed, variant, run_dir)
            args = _command_line(base, values, f"{where}, run '{run_name}'")
            runs.append(RunSpec(len(runs), log_dir, seed, variant, run_dir, args))
    return SweepPlan(sweep=sweep, recipe=recipe, exp_dir=exp_dir, runs=runs)


def _check_name_and_seeds(sweep: Sweep, where: str) -> None:
    if not _NAME.match(sweep.name or ""):
        raise SweepError(f"{where}: name must be letters, digits, '.', '_' or '-'")
    if not sweep.seeds or len(set(sweep.seeds)) != len(sweep.seeds):
        raise SweepError(f"{where}: seeds must be a non-empty list without repeats, got {sweep.seeds!r}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in sweep.seeds):
        raise SweepError(f"{where}: seeds must be integers, got {sweep.seeds!r}")


def _command_line(base: Any, values: dict[str, Any], where: str) -> tuple[str, ...]:
    """A run's overrides ``values`` as ``key=value`` arguments, after checking that they apply to the recipe's
    ``base`` config and read back from the command line as the same config."""
    try:
        cfg = apply_overrides(base, values)
        args = [f"{k}={_as_arg(v)}" for k, v in values.items()]
        from_cli = apply_overrides(base, args)
    except ConfigError as e:
        raise SweepError(f"{where}: {e}") from e
    lost = diff_configs(to_dict(cfg), to_dict(from_cli))
    if lost:
        key, (want, got) = next(iter(lost.items()))
        raise SweepError(
            f"{where}: config key '{key}' = {want!r} reads back as {got!r} "
            "from the command line; use a plain number, string, bool or list"
        )
    return tuple(args)
