"""The ``tdrl`` command: a thin dispatcher to subcommands, each a module with ``main(argv) -> int``.

    tdrl plot RUN_DIR... [--metric KEY ...] [--out DIR]     learning curves (tdrl.plot)
    tdrl sweep plan|local|slurm|status ...                   sweeps (tdrl.launch.cli, same as slurm/launch.py)

A subcommand's module is imported only when it is called, so ``tdrl --help`` is instant. To add one, write a
small function that imports its module and calls ``main(argv)``, and list it in ``SUBCOMMANDS``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

__all__ = ["SUBCOMMANDS", "main"]


def _plot(argv: list[str]) -> int:
    from tdrl.plot import main as plot_main

    return plot_main(argv)


def _sweep(argv: list[str]) -> int:
    from tdrl.launch.cli import main as sweep_main

    return sweep_main(argv, prog="tdrl sweep")


SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "plot": (_plot, "learning-curve PNGs from run directories (mean and 95% CI over seeds)"),
    "sweep": (_sweep, "plan, run locally, submit to SLURM, or follow a sweep (slurm/sweeps/*.py)"),
}
"""``name: (function(argv) -> exit status, one-line help)``."""


def _usage() -> str:
    lines = ["usage: tdrl <command> [args...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `tdrl <command> --help` for a command's arguments."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv[0]`` to its subcommand; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(f"tdrl: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return int(SUBCOMMANDS[command][0](rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
