"""A quiet console: a successful recipe run prints tdrl's own lines, the progress bar and nothing else.

:func:`quiet_console` (entered by :func:`tdrl.utils.dotted_config.run_recipe`, so by every recipe's command line,
never by a user's own script) silences the third-party messages below, each checked to be harmless, at its source
where the library offers a switch, else with a warnings filter scoped to its exact message, category and module.
The filters reach child processes too (collector workers, data-parallel ranks, a local Ray's workers) through
``PYTHONWARNINGS``, which every Python reads at start-up. ``TDRL_DEBUG=1`` turns all of it off: everything shows.

Filtered, and why each is harmless:

- **SDL** ``error: XDG_RUNTIME_DIR is invalid or not set in the environment.`` -- printed by pygame's SDL when it
  initialises its video subsystem (gymnasium's classic-control envs draw ``eval.video=true`` frames with pygame) on
  a machine without a desktop session (ssh, containers, SLURM), from SDL's Wayland probe. The frames are drawn on an
  off-screen ``pygame.Surface``, never in a window, so SDL's ``dummy`` video driver renders the same pixels:
  ``SDL_VIDEODRIVER=dummy`` is set unless the user set it.
- **TorchRL** ``No target network updater has been associated with this loss module`` (``UserWarning`` from
  ``torchrl.objectives.common``) -- TorchRL expects one of its own ``SoftUpdate``/``HardUpdate``; every recipe
  updates the loss's ``target_*`` networks with tdrl's :class:`~tdrl.objectives.update.TargetUpdate` instead
  (its hard copies and polyak steps on the loss's targets: ``tests/objectives/test_update.py``).
- **MuJoCo** ``MuJoCo - compiler attribute 'settotalmass' is deprecated`` (``RuntimeWarning`` from
  ``tdrl.envs.families``, which routes MuJoCo's warnings to Python's) -- gymnasium's own HalfCheetah XML uses the
  attribute; the model still compiles with the masses it always had, and nothing a user sets changes it.
- **TorchRL** ``The VecNorm class is to be deprecated in favor of `torchrl.envs.VecNormV2` ...`` and ``This class
  is to be deprecated in favor of VecNormV2`` (``FutureWarning``, printed by every ``VecNorm(...)``, whatever its
  arguments) -- PPO's ``collector.obs_norm=true`` uses TorchRL 0.14's ``VecNorm`` on purpose: it is a per-step map
  (:mod:`tdrl.collect.transform`'s fast path) and PPO's MuJoCo results were measured with it; moving to
  ``VecNormV2`` is a change of statistics to re-measure, not a console fix.
- **Ray** (``trainer.kind=ray``), sent to the run's ``debug.log`` instead of the terminal
  (:func:`ray_output_to_run_log`): what ``ray.init`` prints (the token-authentication notice; the local-IP
  detection's fallback to the host name, on a machine without a route to the internet), and the error Ray's core
  logs once, for the first actor built with a reference among its arguments (ray#53727: a restart needs the
  referenced object; the trainer holds the collector factory and the hub for the whole run, so restarts find
  them). The actors' own output stays in Ray's worker logs (``/tmp/ray/session_latest/logs``;
  ``log_to_driver=False``, :func:`ray_init_options`): an actor's failure still reaches the run as an exception, and
  the trainer reports it in a ``tdrl:`` line.
- **W&B** (``logger.wandb=true``, the default): its banner, the run's history and summary and the ``wandb sync``
  hint, about 40 ``wandb:`` lines a run -- silenced at the source by tdrl's W&B sink (:mod:`tdrl.log.wandb_sink`:
  the run's ``silent`` setting; W&B's errors and warnings still print), which prints one ``tdrl:`` line instead
  when the run ends: where the files are and the ``wandb sync`` command that uploads them (offline), or the URL.
  That holds in a user's own script too, where :func:`quiet_console` is not entered.

A SLURM job (:mod:`tdrl.launch.job`, every run of a SLURM sweep) calls the recipe's ``main`` without its command line
and enters :func:`quiet_console` itself; a local sweep runs the command line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from tdrl.utils.interrupt import noted_run_dir

__all__ = ["HARMLESS", "Harmless", "debugging", "quiet_console", "ray_init_options", "ray_output_to_run_log"]

RUN_LOG = "debug.log"  # the run's log file in its directory (tdrl.log.Run.open tees every print into it)


class Harmless(NamedTuple):
    """A third-party warning checked to be harmless (the module docstring says why): its message's start, category
    and the module it is attributed to. No ``:`` or ``,`` in any field (``PYTHONWARNINGS`` separators)."""

    message: str
    category: type[Warning]
    module: str

    def option(self) -> str:
        """This filter as a ``-W`` / ``PYTHONWARNINGS`` entry (message start and module matched literally)."""
        return f"ignore:{self.message}:{self.category.__name__}:{self.module}"


HARMLESS = (
    Harmless("No target network updater has been associated with this loss module", UserWarning,
             "torchrl.objectives.common"),
    Harmless("MuJoCo - compiler attribute 'settotalmass' is deprecated", RuntimeWarning, "tdrl.envs.families"),
    Harmless("The VecNorm class is to be deprecated", FutureWarning, "torchrl.envs.transforms._normalization"),
    Harmless("This class is to be deprecated in favor of", FutureWarning, "torchrl.envs.transforms._normalization"),
)

_quiet = {"on": False}  # inside quiet_console: connect_ray asks through ray_init_options / ray_output_to_run_log


def debugging() -> bool:
    """``TDRL_DEBUG`` is set (and not ``0``): show every message and traceback."""
    return os.environ.get("TDRL_DEBUG", "") not in ("", "0")


@contextlib.contextmanager
def quiet_console() -> Iterator[None]:
    """Silence the harmless third-party messages of the module docstring while the block runs (a recipe), in this
    process and in the processes it starts; put the environment and the warnings filters back after it. Does
    nothing under ``TDRL_DEBUG=1``."""
    if debugging():
        yield
        return
    saved = {name: os.environ.get(name) for name in ("SDL_VIDEODRIVER", "PYTHONWARNINGS")}
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    options = [h.option() for h in HARMLESS]
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [saved["PYTHONWARNINGS"], *options]))
    _quiet["on"] = True
    try:
        with warnings.catch_warnings():
            for h in HARMLESS:  # as Python applies the options above: start of the message, exact module
                warnings.filterwarnings("ignore", re.escape(h.message), h.category, re.escape(h.module) + r"\Z")
            yield
    finally:
        _quiet["on"] = False
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def ray_init_options() -> dict[str, Any]:
    """Logging arguments for ``ray.init``: the ``ray`` logger at WARNING, and in a recipe (:func:`quiet_console`)
    the actors' stdout and stderr left in Ray's worker logs instead of copied to this terminal."""
    return {"logging_level": logging.WARNING, "configure_logging": True, "log_to_driver": not _quiet["on"]}


@contextlib.contextmanager
def ray_output_to_run_log() -> Iterator[None]:
    """In a recipe with a run directory open, send what the enclosed Ray calls (``ray.init``, building the actors)
    write to stderr -- Python's ``sys.stderr`` (Ray's logger writes there when it logs) and the native file
    descriptor 2 (Ray's C++ core) -- to the run's ``debug.log``, appended; the terminal gets stderr back after the
    block, so an exception raised in it still ends the run with its one line there."""
    run_dir = noted_run_dir()
    if not _quiet["on"] or run_dir is None:
        yield
        return
    sys.stderr.flush()
    saved_fd, saved_stream = os.dup(2), sys.stderr
    with open(Path(run_dir) / RUN_LOG, "a", buffering=1, encoding="utf-8", errors="replace") as log:
        os.dup2(log.fileno(), 2)
        sys.stderr = log
        try:
            yield
        finally:
            log.flush()
            sys.stderr = saved_stream
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
