"""The ``tdrl`` command: ``tdrl plot`` (:mod:`tdrl.plot`) and ``tdrl sweep`` (:mod:`tdrl.launch.cli`, the same
as ``slurm/launch.py``); each module is imported only when its command runs, so ``tdrl --help`` is instant."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]

USAGE = """usage: tdrl <command> [args...]

commands:
  plot       learning-curve PNGs from run directories (interquartile mean and its 95% bootstrap CI over seeds)
  sweep      plan, run locally, submit to SLURM, or follow a sweep (slurm/sweeps/*.py)

Run `tdrl <command> --help` for a command's arguments."""


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv[0]`` to its subcommand; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "plot":
        from tdrl.plot import main as plot_main

        return plot_main(rest)
    if command == "sweep":
        from tdrl.launch.cli import main as sweep_main

        return sweep_main(rest, prog="tdrl sweep")
    print(f"tdrl: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
