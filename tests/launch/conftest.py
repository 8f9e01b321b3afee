"""Fixtures for the launcher tests: the tiny recipes, sweep files written on the fly, the local SLURM cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TINY_RECIPE = HERE / "tiny_recipe.py"
DIST_RECIPE = HERE / "dist_recipe.py"


@pytest.fixture
def write_sweep(tmp_path):
    """``write_sweep(name, body)`` -> path of a sweep file; ``body`` is the Sweep(...) keyword arguments."""

    def write(name: str, body: str, recipe: Path = TINY_RECIPE) -> Path:
        path = (
            tmp_path / "sweeps" / f"{name}.py"
        )  # not in the cwd, where it could shadow a module named like it
        path.parent.mkdir(exist_ok=True)
        path.write_text(
            "from tdrl.launch import Resources, Sweep, VariantLevel\n\n"
            f"sweep = Sweep(\n    name={name!r},\n    recipe={str(recipe)!r},\n    root={str(tmp_path / 'runs')!r},\n"
            + textwrap.indent(textwrap.dedent(body).strip(), "    ")
            + "\n)\n"
        )
        return path

    return write


def _node_state() -> str:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"sinfo failed: {e}"
    return (
        out.stdout.split()[0]
        if out.returncode == 0 and out.stdout.split()
        else f"sinfo: {out.stderr.strip()}"
    )


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local one-node SLURM cluster; started with slurm/local-cluster.sh if it is not up (skip if it can't)."""
    ok = ("idle", "mixed", "allocated", "completing")
    if shutil.which("sinfo") is None or _node_state() not in ok:
        script = REPO / "slurm" / "local-cluster.sh"
        if os.geteuid() != 0:
            pytest.skip(
                "local SLURM cluster is not up and starting it needs root (bash slurm/local-cluster.sh start)"
            )
        try:
            res = subprocess.run(
                ["bash", str(script), "start"], capture_output=True, text=True, timeout=300
            )
        except subprocess.TimeoutExpired:
            pytest.skip("slurm/local-cluster.sh start did not finish in 300 s")
        if res.returncode != 0 or _node_state() not in ok:
            pytest.skip(
                f"local SLURM cluster could not start: {(res.stdout + res.stderr).strip()[-500:]}"
            )
    return True


TWO_NODES = ("tdrl-n1", "tdrl-n2")


def _multi_partition_idle() -> bool:
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-p", "multi", "-o", "%N %T"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
    return all(states.get(node) in ("idle", "mixed", "allocated", "completing") for node in TWO_NODES)


@pytest.fixture(scope="session")
def slurm_two_nodes():
    """The local cluster with its two namespace nodes tdrl-n1, tdrl-n2 (partition ``multi``); started with
    ``slurm/local-cluster.sh start --nodes 2`` if they are not up (skip, with the reason, if they can't be)."""
    if shutil.which("sinfo") is not None and _multi_partition_idle():
        return TWO_NODES
    if os.geteuid() != 0:
        pytest.skip("the two-node SLURM cluster is not up and starting it needs root "
                    "(bash slurm/local-cluster.sh start --nodes 2)")
    script = REPO / "slurm" / "local-cluster.sh"
    try:
        res = subprocess.run(["bash", str(script), "start", "--nodes", "2"], capture_output=True, text=True,
                             timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("slurm/local-cluster.sh start --nodes 2 did not finish in 300 s")
    if res.returncode != 0 or not _multi_partition_idle():
        pytest.skip(f"two-node SLURM cluster could not start: {(res.stdout + res.stderr).strip()[-500:]}")
    return TWO_NODES
