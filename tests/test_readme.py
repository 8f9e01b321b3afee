"""The README works as written: its Python example runs, and every command in it runs (recipes with a tiny budget
appended, `tdrl plot` on the runs they made, the sweep plan) or is named here with the reason it cannot run in a
test. A command added to the README without a place here fails the test."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

NOT_RUN = {  # command -> why a test does not run it
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": "installs packages (what it "
                                                                                 "resolves to: test_user_commands)",
    'pip install -e ".[dev]"': "installs packages",
    "make test": "runs the test suite this test is part of",
    "python recipes/impala.py trainer.kind=ray": "starts Ray, which must stay on loopback: tests/distributed runs it "
                                                 "in a network namespace of its own",
    "python recipes/dqn.py trainer.kind=ray trainer.ray_address=HEAD:6379 trainer.n_actors=16 "
    "replay.prioritized=true": "needs a Ray cluster: tests/distributed runs it against a loopback cluster",
    "python slurm/launch.py local slurm/sweeps/ppo_cartpole_lr.py": "12 runs of 100k frames (its launcher is tested "
                                                                    "in tests/launch)",
}
COMMON = ["logger.wandb=false", "logger.progress_bar=false", "eval.n_envs=1", "eval.max_steps=20",
          "run.torch_threads=1"]  # dqn/sac/td3 default to 2 threads: ~10x slower updates on a shared core
OFF_POLICY = ["optim.min_steps_learn=16", "optim.batch_size=16", "optim.replay_ratio=16", "replay.size=1000",
              "model.hidden_sizes=[16]"]
TINY = {  # a budget of a few iterations and two log rows per recipe
    "ppo.py": ["collector.total_frames=256", "logger.log_interval_steps=128", "loss.epochs=1"],
    "a2c.py": ["collector.total_frames=80", "logger.log_interval_steps=40"],
    "impala.py": ["collector.total_frames=160", "logger.log_interval_steps=80"],
    "mappo.py": ["collector.batch_B=2", "collector.batch_T=25", "collector.total_frames=100",
                 "logger.log_interval_steps=50", "loss.epochs=1"],
    "dqn.py": ["collector.total_frames=64", "logger.log_interval_steps=32", *OFF_POLICY],
    "ddpg.py": ["collector.total_frames=40", "logger.log_interval_steps=20", *OFF_POLICY],
    "td3.py": ["collector.total_frames=40", "logger.log_interval_steps=20", *OFF_POLICY],
    "sac.py": ["collector.total_frames=40", "logger.log_interval_steps=20", *OFF_POLICY],
    "qmix.py": ["collector.batch_B=2", "collector.total_frames=100", "logger.log_interval_steps=50", *OFF_POLICY],
    "maddpg.py": ["collector.batch_B=2", "collector.total_frames=100", "logger.log_interval_steps=50", *OFF_POLICY],
    "r2d1.py": ["collector.batch_B=2", "collector.batch_T=10", "collector.total_frames=400",
                "logger.log_interval_steps=200", "optim.min_steps_learn=200", "model.hidden_sizes=[16]",
                "model.lstm_size=16", "model.head_sizes=[16]", "replay.size=2000", "replay.warmup_T=5",
                "replay.batch_T=10", "loss.n_step=3", "optim.batch_B=4", "optim.replay_ratio=6"],
}


def readme_commands() -> list[tuple[str, str]]:
    """(command, expected error text or "") for each line of the README's bash blocks, then the recipe table's."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command, _, comment = line.partition("  #")
            if command.strip():
                error = comment.split("error: ", 1)[1].strip() if "error: " in comment else ""
                found.append((" ".join(command.split()), error))
    found += [(command, "") for command in re.findall(r"^\| `(python recipes/\w+\.py)`", README, flags=re.M)]
    return found


def script_env() -> dict[str, str]:
    """A user's shell: not attached to a W&B service an in-process test of this worker started (WANDB_SERVICE), which
    would still hold a SIGKILLed launch's run id when the relaunch asks for it ("run ID ... is in use")."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    return {**env, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=script_env(), capture_output=True, text=True, timeout=600)


def as_tiny_recipe_run(command: str, runs: Path) -> list[str]:
    """``python recipes/X.py ARGS``: absolute path, the tiny budget, runs under ``runs``."""
    words = shlex.split(command)
    recipe = Path(words[1]).name
    return [sys.executable, str(ROOT / words[1]), *TINY[recipe], *COMMON, *words[2:], f"run.root={runs}"]


def demo_command() -> str:
    """The `make demo` line of the Makefile, with ``$(PY)`` as ``python``."""
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    return recipe.strip().splitlines()[-1].strip().replace("$(PY)", "python")


def test_readme_is_short_and_its_links_exist():
    assert len(README) <= 10_500  # the Python example is the resumable script (run directory, seed, guard)
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_every_readme_command_runs(tmp_path):
    runs, covered, errors = tmp_path / "runs", [], []
    for command, error in readme_commands():
        if command in NOT_RUN:
            continue
        if command == "make demo":
            command = demo_command()
        if command.startswith("python recipes/"):
            proc = run(as_tiny_recipe_run(command, runs) if "--help" not in command else
                       [sys.executable, str(ROOT / command.split()[1]), "--help"], tmp_path)
        elif command.startswith("python slurm/launch.py plan"):
            proc = run([sys.executable, *shlex.split(command)[1:]], ROOT)  # plans and prints, writes nothing
        elif command.startswith("tdrl plot"):
            continue  # after the recipe runs, below: it plots them
        else:
            pytest.fail(f"README command {command!r} is neither run nor listed in NOT_RUN")
        if error:
            assert proc.returncode == 2 and proc.stderr.strip() == f"error: {error}", (command, proc.stderr)
        else:
            assert proc.returncode == 0, (command, proc.stderr[-3000:])
        covered.append(command)
        errors.append(error)
    trained = [c for c, e in zip(covered, errors, strict=True) if "recipes/" in c and "--help" not in c and not e]
    assert len(list(runs.rglob("summary.json"))) == len(trained) >= 8  # the demo, the table's six, the overrides
    assert list(runs.rglob("videos/video_*.mp4"))  # eval.video=true
    (plot,) = [c for c, _ in readme_commands() if c.startswith("tdrl plot")]
    proc = run([sys.executable, "-m", "tdrl.cli", "plot", str(runs), "--out", str(tmp_path / "plots")], tmp_path)
    assert proc.returncode == 0 and "final IQM [95% CI]" in proc.stdout, (plot, proc.stderr)
    assert (tmp_path / "plots" / "summary.csv").is_file()


def readme_example(**replace: str) -> str:
    """The README's Python example on a budget of a few seconds, with ``replace``'s text replacements too."""
    (code,) = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    small = {"n_steps=30_000": "n_steps=1_024", "log_interval_steps=5_000": "log_interval_steps=256",
             "min_steps_learn=1_000": "min_steps_learn=64", **replace}
    for big, small_text in small.items():
        assert big in code, big
        code = code.replace(big, small_text)
    return code


def test_python_example_runs(tmp_path):
    (tmp_path / "example.py").write_text(readme_example())
    proc = run([sys.executable, "example.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'frames': 1024" in proc.stdout and "'eval/return_mean'" in proc.stdout
    assert (tmp_path / "runs" / "dqn" / "replay").is_dir() and (tmp_path / "runs" / "dqn" / "summary.json").is_file()
    assert "Warning" not in proc.stderr, proc.stderr  # it captures everything it needs: nothing to warn about


VECNORM_PARALLEL = {  # the README's transform line in the example: VecNorm in a parallel collector
    'make_collector("serial", env, chain_policy(q, explore), batch_B=4, batch_T=8)':
        'make_collector("parallel", env, chain_policy(q, explore), batch_B=4, batch_T=8, n_workers=2, '
        'transform=__import__("torchrl.envs").envs.VecNorm(in_keys=["observation"]))',
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["as written", "VecNorm, parallel"])
def test_python_example_killed_and_relaunched_ends_bitwise_equal(tmp_path, variant):
    """The README's example as a user's script: SIGKILLed mid-run and launched again, it ends with the parameters,
    optimizer, replay and progress.csv of a run that was never stopped."""
    from kill_checks import assert_same_progress, assert_same_replay, assert_same_tree, kill_when, newest_state

    code = readme_example(**(VECNORM_PARALLEL if variant != "as written" else {}))
    results = {}
    for name in ("reference", "killed"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "example.py").write_text(code)
        command = [sys.executable, "example.py"]
        if name == "killed":
            proc = subprocess.Popen(command, cwd=tmp_path / name, env=script_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            rows = tmp_path / name / "runs" / "dqn" / "progress.csv"
            kill_when(proc, lambda rows=rows: rows.is_file() and len(rows.read_text().splitlines()) >= 3, 0.05,
                      f"{variant}: killed after 2 rows")
        proc = run(command, tmp_path / name)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = tmp_path / name / "runs" / "dqn"
    note = f"README example ({variant})"
    assert_same_progress(results["reference"], results["killed"], note)
    assert_same_tree(newest_state(results["reference"]), newest_state(results["killed"]), note)
    assert_same_replay(results["reference"], results["killed"], note)


@pytest.mark.timeout(300)
def test_python_example_with_vecnorm_evaluates_through_it(tmp_path):
    """The README's transform line in its example: a policy trained on VecNorm observations is evaluated on them
    (an evaluator on raw observations scores ~10 with a policy that earns ~150 in training)."""
    code = readme_example(**VECNORM_PARALLEL, **{"n_steps=30_000": "n_steps=10_000",
                                                 "log_interval_steps=5_000": "log_interval_steps=5_000"})
    (tmp_path / "example.py").write_text(code)
    proc = run([sys.executable, "example.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "dqn" / "summary.json").read_text())
    train, evaluated = summary["train/return_mean"], summary["eval/return_mean"]
    assert evaluated >= 0.8 * train and evaluated >= 50, (train, evaluated)
