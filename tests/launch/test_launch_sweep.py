"""Sweep files and plans: run order, per-run overrides, and bad input failing before anything is launched."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tdrl.launch import Sweep, SweepError, load_sweep, plan_sweep
from tdrl.launch.recipe import load_recipe

HERE = Path(__file__).resolve().parent
LAUNCH = HERE.parents[1] / "slurm" / "launch.py"


def test_plan_orders_seeds_outer_and_builds_each_runs_command(write_sweep, tmp_path):
    path = write_sweep(
        "grid",
        """
        levels=[VariantLevel(["train.lr"], [[0.01], [0.003]], ["lr1e-2", "lr3e-3"])],
        seeds=[0, 1],
        overrides={"train.iterations": 5, "train": {"hidden": 8}},
        """,
    )
    plan = plan_sweep(load_sweep(path))
    assert plan.exp_dir == (tmp_path / "runs" / "grid").resolve()
    assert [r.name for r in plan.runs] == [
        "lr1e-2/run_0",
        "lr3e-3/run_0",
        "lr1e-2/run_1",
        "lr3e-3/run_1",
    ]
    run = plan.runs[3]
    assert run.run_dir == plan.exp_dir / "lr3e-3" / "run_1"
    assert run.variant == {"train": {"lr": 0.003}}
    args = dict(a.split("=", 1) for a in run.overrides)
    assert (
        args["train.lr"] == "0.003"
        and args["train.iterations"] == "5"
        and args["train.hidden"] == "8"
    )
    assert args["run.seed"] == "1" and args["run.dir"] == str(run.run_dir)
    assert args["logger.group"] == "grid"  # one W&B group per sweep
    cmd = run.command(plan.recipe, "python")
    assert cmd[:2] == ["python", str(HERE / "tiny_recipe.py")]
    # the command line gives the recipe exactly the planned config
    module = load_recipe(plan.recipe)
    from tdrl.config import apply_overrides

    cfg = apply_overrides(module.Config(), list(run.overrides))
    assert (cfg.train.lr, cfg.train.hidden, cfg.run.seed) == (0.003, 8, 1)


def test_recipe_path_is_found_from_the_sweep_files_folder(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "tiny.py").write_text((HERE / "tiny_recipe.py").read_text())
    (tmp_path / "slurm" / "sweeps").mkdir(parents=True)
    sweep_file = tmp_path / "slurm" / "sweeps" / "s.py"
    sweep_file.write_text(
        "from tdrl.launch import Sweep\nsweep = Sweep(name='s', recipe='recipes/tiny.py')\n"
    )
    monkeypatch.chdir("/")
    plan = plan_sweep(load_sweep(sweep_file), root=tmp_path / "runs")
    assert plan.recipe == tmp_path / "recipes" / "tiny.py"


def test_unknown_key_in_a_variant_names_the_run_and_the_key(write_sweep):
    path = write_sweep(
        "typo", 'levels=[VariantLevel(["train.lr", "train.hiden"], [[0.1, 4]], ["a"])],'
    )
    with pytest.raises(
        SweepError,
        match=r"run 'a/run_0': unknown config key 'train.hiden'; did you mean 'train.hidden'",
    ):
        plan_sweep(load_sweep(path))


def test_bad_value_and_unknown_override_key(write_sweep):
    with pytest.raises(SweepError, match="config key 'train.iterations': expected an int"):
        plan_sweep(load_sweep(write_sweep("badval", 'overrides={"train.iterations": "lots"},')))
    with pytest.raises(SweepError, match="unknown config key 'optim.lr'"):
        plan_sweep(load_sweep(write_sweep("badkey", 'overrides={"optim.lr": 0.1},')))


def test_unknown_recipe_is_named_with_a_suggestion(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "ppo.py").write_text("")
    sweep = Sweep(name="x", recipe=str(tmp_path / "recipes" / "ppoo.py"))
    with pytest.raises(
        SweepError, match=r"unknown recipe '.*ppoo.py': no such file; did you mean ppo.py"
    ):
        plan_sweep(sweep)


def test_not_a_recipe_and_bad_sweep_files(tmp_path, write_sweep):
    (tmp_path / "notrecipe.py").write_text("x = 1\n")
    with pytest.raises(SweepError, match="has no dataclass 'Config'"):
        plan_sweep(Sweep(name="x", recipe=str(tmp_path / "notrecipe.py")))
    (tmp_path / "empty.py").write_text("from tdrl.launch import Sweep\n")
    with pytest.raises(SweepError, match=r"must define 'sweep = Sweep\(...\)'"):
        load_sweep(tmp_path / "empty.py")
    with pytest.raises(SweepError, match="seeds must be a non-empty list without repeats"):
        plan_sweep(load_sweep(write_sweep("dup", "seeds=[1, 1],")))
    with pytest.raises(SweepError, match="name must be"):
        plan_sweep(Sweep(name="a b", recipe=str(HERE / "tiny_recipe.py")))


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(LAUNCH), *args], capture_output=True, text=True, timeout=timeout
    )


def test_cli_bad_input_fails_fast_and_launches_nothing(write_sweep, tmp_path):
    typo = write_sweep("typo", 'levels=[VariantLevel(["train.lrr"], [[0.1]], ["a"])],')
    for command in ("plan", "local", "slurm"):
        t0 = time.monotonic()
        res = _cli(command, str(typo))
        assert res.returncode == 2, res.stderr
        assert "unknown config key 'train.lrr'; did you mean 'train.lr'" in res.stderr
        assert time.monotonic() - t0 < 30
    too_big = write_sweep("big", "seeds=[0],")
    res = _cli("local", str(too_big), "--cpus-per-run", "999")
    assert res.returncode == 2 and "cpus_per_run=999 but this machine has" in res.stderr
    res = _cli("plan", str(write_sweep("norecipe", "seeds=[0],", recipe=tmp_path / "nope.py")))
    assert res.returncode == 2 and "unknown recipe" in res.stderr
    assert not (tmp_path / "runs").exists()  # nothing was created, let alone started


@pytest.mark.parametrize(
    "sweep_file", sorted((HERE.parents[1] / "slurm" / "sweeps").glob("*.py")), ids=lambda p: p.name
)
def test_example_sweeps_are_valid(sweep_file):
    sweep = load_sweep(sweep_file)
    try:
        plan = plan_sweep(sweep, root="runs")
    except SweepError as e:
        if "unknown recipe" in str(e):
            pytest.skip(f"{sweep.recipe} is not in this checkout yet")
        raise
    assert plan.runs and all(r.run_dir.is_relative_to(plan.exp_dir) for r in plan.runs)


SPAWN_RECIPE = """
import multiprocessing as mp, sys
from dataclasses import dataclass, field
from tdrl.config import RunConfig, parse_args

@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)

def square(x):  # defined in the recipe: workers must be able to import it by reference
    return x * x

def main(cfg):
    with mp.get_context("spawn").Pool(2) as pool:
        return {"squares": pool.map(square, [1, 2, 3])}

if __name__ == "__main__":
    main(parse_args(Config(), sys.argv[1:]))
"""


@pytest.mark.timeout(120)
def test_recipe_job_in_process_reaches_spawned_workers(tmp_path):
    """A SLURM job runs main(cfg) in-process; the recipe's own functions must still pickle into spawned workers."""
    recipe = tmp_path / "recipes" / "spawny.py"
    recipe.parent.mkdir()
    recipe.write_text(SPAWN_RECIPE)
    code = (
        "from tdrl.launch.job import RecipeJob; import sys;"
        f"print(RecipeJob({str(recipe)!r}, ['run.dir={tmp_path}/r'], {str(tmp_path / 'r')!r})())"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    assert "{'squares': [1, 4, 9]}" in res.stdout
    assert '"event": "end"' in (tmp_path / "r" / "launch_events.jsonl").read_text()


def test_requeue_command_outlives_the_sigterm_of_the_requeue(tmp_path):
    """submitit runs ``scontrol requeue`` after RecipeJob.checkpoint, and SLURM's requeue SIGTERMs the whole job,
    scontrol too if it is still running (seen in CI: the requeue failed). A command started after checkpoint
    survives a SIGTERM; one started before it does not."""
    code = (
        "from tdrl.launch.job import RecipeJob; import subprocess;"
        "term = ['sh', '-c', 'kill -TERM $$; echo alive'];"
        "print('before', subprocess.run(term, capture_output=True, text=True).returncode);"
        f"RecipeJob('recipe.py', [], {str(tmp_path / 'r')!r}).checkpoint();"
        "print('after', subprocess.run(term, capture_output=True, text=True).stdout.strip())"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["before", "-15", "after", "alive"], res.stdout
    assert '"event": "requeue"' in (tmp_path / "r" / "launch_events.jsonl").read_text()
