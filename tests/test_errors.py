"""User errors from the recipes' command line: one line ``error: ...``, exit status 2, no traceback unless
``TDRL_DEBUG=1``; config errors before torch, TorchRL or any env is imported."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.name for p in (ROOT / "recipes").glob("*.py"))
HEAVY = ("torch", "torchrl", "tensordict", "gymnasium", "mujoco", "numpy")
# The module fixtures below run a dozen recipe processes each; in one xdist worker they run once, not once per worker.
pytestmark = pytest.mark.xdist_group("errors")


def run(recipe: str, *args: str, debug: bool = False, importtime: bool = False) -> tuple[subprocess.CompletedProcess,
                                                                                         float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TDRL_DEBUG": "1" if debug else "0"}
    flags = ["-X", "importtime"] if importtime else []
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *flags, str(ROOT / "recipes" / recipe), *args, "logger.wandb=false"],
                          capture_output=True, text=True, env=env, timeout=300)
    return proc, time.perf_counter() - start


def assert_one_line_error(proc: subprocess.CompletedProcess, *expected: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for text in expected:
        assert text in lines[0]


CONFIG_ERRORS = [
    ("ppo.py", ["optim.lrr=1e-3"], "did you mean 'optim.lr'"),
    ("ppo.py", ["run.seed=abc"], "config key 'run.seed': expected an int"),
    ("ppo.py", ["collector.kind=parallel", "collector.n_workers=3"], "divisible by collector.n_workers=3"),
    ("ppo.py", ["run.device=gpu"], "run.device='gpu' is not a device"),
    ("sac.py", ["optim.cudagraphs=true"], "optim.cudagraphs=true replays CUDA graphs, but run.device='cpu'"),
    *[(recipe, ["collector.batch_B=0"], "config key 'collector.batch_B': 0 must be >= 1") for recipe in RECIPES],
    # found by a user: each ran (or failed with a torch traceback seconds later) before ranges were declared
    ("ppo.py", ["optim.lr=-1"], "config key 'optim.lr': -1.0 must be > 0"),
    ("ppo.py", ["optim.lr=0"], "config key 'optim.lr': 0.0 must be > 0"),
    ("a2c.py", ["loss.gamma=2"], "config key 'loss.gamma': 2.0 must be in (0, 1]"),
    ("ddpg.py", ["optim.actor_lr=-1"], "config key 'optim.actor_lr': -1.0 must be > 0"),
    ("ppo.py", ["model.hidden_sizes=[0]"], "config key 'model.hidden_sizes[0]': 0 must be >= 1"),
    ("ppo.py", ["model.hidden_sizes=[64,"], "config key 'model.hidden_sizes': '[64,' is not a list"),
    ("ppo.py", ["trainer.kind=async"], "config key 'trainer.kind': 'async' is not one of ['sync', 'ddp']"),
    ("qmix.py", ["env.options=[N]"], "config key 'env.options': 'N' is not name=value"),
    ("mappo.py", ["env.options=[group_map=one_group]"], "config key 'env.options': group_map is set by tdrl"),
]


@pytest.mark.parametrize("recipe, args, message", CONFIG_ERRORS)
def test_config_errors_are_one_line_before_torch(recipe, args, message):
    """Found before torch, TorchRL or any env is imported (what makes them instant; no wall-clock assert: the suite
    shares two cores)."""
    proc, _ = run(recipe, *args, importtime=True)  # which modules the failing command imported
    assert_one_line_error(proc, message)
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "tdrl" in imported and not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_debug_shows_the_traceback():
    proc, _ = run("ppo.py", "collector.batch_B=0", debug=True)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ConfigError" in proc.stderr


BUILD_ERRORS = {  # found once the env or the machine is looked at (after torch loads), still one line
    "unknown env id": ("ppo.py", ["env.id=CartPol-v1"],
                       "unknown environment id 'CartPol-v1'; did you mean 'CartPole-v1'"),
    "SAC on discrete actions": ("sac.py", ["env.id=CartPole-v1"], "SAC needs a continuous (Box) action space"),
    "DQN on continuous actions": ("dqn.py", ["env.id=Pendulum-v1"], "DQN needs a discrete action space"),
    "TD3 on discrete actions": ("td3.py", ["env.id=CartPole-v1"], "discrete"),
    "categorical A2C on a Box": ("a2c.py", ["env.id=Pendulum-v1", "model.distribution=categorical"],
                                 "does not fit this env's continuous"),
    "more ranks than cores": ("ppo.py", ["trainer.kind=ddp", "trainer.world_size=512"],
                              "trainer.world_size=512 exceeds"),
    "a CUDA device this machine lacks": ("a2c.py", ["run.device=cuda:7"], "run.device='cuda:7'"),
    "a frozen agent group the env lacks": ("mappo.py", ["env.id=mpe2/simple_adversary_v3",
                                                         "optim.frozen_groups=[adversry]"],
                                           "optim.frozen_groups names ['adversry']; this env's agent groups are "
                                           "['adversary', 'agent']"),
    "value decomposition on a turn-based env": ("qmix.py", ["env.id=pettingzoo/classic/tictactoe_v3"],
                                                "is turn-based: one agent moves per step"),
    "an env argument the env does not take": ("maddpg.py", ["env.id=lbforaging/Foraging-8x8-2p-2f-coop-v3"],
                                              "unexpected keyword argument 'continuous_actions'"),
    "an env option the env does not take": ("qmix.py", ["env.options=[N=3,local_ration=0.5]"],
                                            "unexpected keyword argument 'local_ration'"),
    "a scenario option VMAS does not take": ("mappo.py", ["env.id=vmas/balance", "collector.kind=batched_env",
                                                          "env.options=[n_agentz=4]"],
                                             "{'n_agentz': 4} passed but not used by the scenario"),
}
MARL_PACKAGES = {"mpe2/": "mpe2", "pettingzoo/": "pettingzoo", "lbforaging/": "lbforaging", "vmas/": "vmas"}


def _side_by_side(launches: dict[str, tuple[list[str], dict[str, str]]], width: int = 2
                  ) -> dict[str, subprocess.CompletedProcess]:
    """Run the commands ``width`` at a time (each spends seconds loading torch on one core): ``{name: result}``."""
    waiting, running, done = list(launches), {}, {}
    while waiting or running:
        while waiting and len(running) < width:
            name = waiting.pop(0)
            command, env = launches[name]
            running[name] = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True)
        name = next(iter(running))
        out, err = running[name].communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(running[name].args, running.pop(name).returncode, out, err)
    return done


@pytest.fixture(scope="module")
def build_outcomes(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    root = tmp_path_factory.mktemp("build")
    launches = {name: ([sys.executable, str(ROOT / "recipes" / recipe), *args, "logger.wandb=false",
                        f"run.root={root / str(i)}"], {**os.environ, "PYTHONPATH": str(ROOT), "TDRL_DEBUG": "0"})
                for i, (name, (recipe, args, _)) in enumerate(BUILD_ERRORS.items())}
    return {name: (proc, root / str(i)) for i, (name, proc) in enumerate(_side_by_side(launches).items())}


@pytest.mark.parametrize("name", list(BUILD_ERRORS))
def test_build_errors_are_one_line(name, build_outcomes):
    if name == "a CUDA device this machine lacks" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    for prefix, package in MARL_PACKAGES.items():
        if any(arg.startswith(f"env.id={prefix}") for arg in BUILD_ERRORS[name][1]):
            pytest.importorskip(package, reason="the [marl] extra")
    proc, root = build_outcomes[name]
    assert_one_line_error(proc, BUILD_ERRORS[name][2])
    assert not list(root.rglob("progress.csv"))  # nothing ran


# --- The run directory: each failure one line, exit 2, and the directory unchanged ------------------------------
# A real PPO run makes the directory; each case relaunches on a copy of it, as a user would, and the copy's files
# must hash the same afterwards. The cases run side by side (each loads torch before it reaches the run directory).

RUN = ("collector.total_frames=2048", "logger.log_interval_steps=512", "eval.n_envs=0", "logger.wandb=false",
       "logger.progress_bar=false")


def _recipe_command(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "recipes" / "ppo.py"), *args]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TDRL_DEBUG": "0", **extra}


def _tree_hashes(directory: Path) -> dict[str, str]:
    """Every entry under ``directory``: files by sha256, folders as such (a new empty folder is a change too)."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(directory.rglob("*"))}


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished PPO run with two kept checkpoints."""
    directory = tmp_path_factory.mktemp("base") / "run"
    proc = subprocess.run(_recipe_command(*RUN, f"run.dir={directory}"), capture_output=True, text=True, env=_env(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(list((directory / "checkpoints").glob("itr_*"))) == 2
    return directory


def _no_checkpoint_loads(run_dir: Path) -> list[str]:
    for state in (run_dir / "checkpoints").glob("itr_*/state.pt"):
        _corrupt(state)
    return []


def _newest_checkpoint_corrupt(run_dir: Path) -> list[str]:
    _corrupt(sorted((run_dir / "checkpoints").glob("itr_*/state.pt"))[-1])
    return ["checkpoint.strict_resume=true"]


def _unreadable_config(run_dir: Path) -> list[str]:
    (run_dir / "config.json").write_text("{not json")
    return []


RUN_DIR_ERRORS = {  # name: (prepare(run_dir) -> extra args, message)
    "no loadable checkpoint": (_no_checkpoint_loads, "no checkpoint is loadable"),
    "strict resume": (_newest_checkpoint_corrupt, "strict resume is on (checkpoint.strict_resume=true)"),
    "another config": (lambda run_dir: ["optim.lr=0.01"], "holds a run with a different config; differing keys: "
                                                          "optim.lr: saved"),
    "unreadable config.json": (_unreadable_config, "cannot read"),
}


@pytest.fixture(scope="module")
def run_dir_outcomes(finished_run, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, bool]]:
    """Each case relaunched on its own copy of the finished run: ``{name: (process, directory unchanged)}``; plus
    a ``run.dir`` that is a file, an unwritable ``run.root`` and W&B online without credentials (none of which may
    leave a directory behind)."""
    root = tmp_path_factory.mktemp("cases")
    launches: dict[str, tuple[list[str], dict[str, str], Path]] = {}
    for name, (prepare, _) in RUN_DIR_ERRORS.items():
        run_dir = root / name.replace(" ", "_")
        shutil.copytree(finished_run, run_dir)
        args = prepare(run_dir)
        launches[name] = (_recipe_command(*RUN, *args, f"run.dir={run_dir}"), _env(), run_dir)
    (root / "a_file").write_text("not a directory")
    launches["run.dir is a file"] = (_recipe_command(*RUN, f"run.dir={root / 'a_file'}"), _env(), root / "a_file")
    launches["run.root cannot be made"] = (_recipe_command(*RUN, "run.root=/proc/tdrl-runs"), _env(), root / "none")
    home = root / "home_without_credentials"
    home.mkdir()
    no_wandb = {k: v for k, v in _env(HOME=str(home)).items() if not k.startswith(("WANDB_", "NETRC"))}
    launches["W&B online without credentials"] = (
        [*_recipe_command(*RUN, f"run.dir={root / 'wandb_run'}"), "logger.wandb=true", "logger.wandb_mode=online"],
        no_wandb, root / "wandb_run")
    before = {name: _tree_hashes(d) if d.is_dir() else d.read_bytes() if d.exists() else None
              for name, (_, _, d) in launches.items()}
    results = _side_by_side({name: (command, env) for name, (command, env, _) in launches.items()})
    outcomes = {}
    for name, proc in results.items():
        d = launches[name][2]
        after = _tree_hashes(d) if d.is_dir() else d.read_bytes() if d.exists() else None
        outcomes[name] = (proc, after == before[name])
    return outcomes


RUN_DIR_MESSAGES = {name: message for name, (_, message) in RUN_DIR_ERRORS.items()} | {
    "run.dir is a file": "is a file, not a directory",
    "run.root cannot be made": "cannot create run directory under '/proc/tdrl-runs'",
    "W&B online without credentials": "logger.wandb_mode=online needs W&B credentials",
}


@pytest.mark.parametrize("name", list(RUN_DIR_MESSAGES))
def test_run_directory_errors_are_one_line_and_change_nothing(name, run_dir_outcomes):
    proc, unchanged = run_dir_outcomes[name]
    assert_one_line_error(proc, RUN_DIR_MESSAGES[name])
    assert unchanged, f"{name}: the launch changed the run directory"


def test_a_run_directory_in_use_names_its_holder_and_sigterm_names_the_resume_command(finished_run, tmp_path):
    """A live run holds its directory: a second launch on it names the holder's pid and host and changes nothing.
    SIGTERM then stops the live run with one line giving the command that resumes it, and exit status 143."""
    run_dir = tmp_path / "live"
    args = ("collector.total_frames=100000000", *RUN[1:], f"run.dir={run_dir}")
    live = subprocess.Popen(_recipe_command(*args), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while not list((run_dir / "checkpoints").glob("itr_*")) and time.monotonic() < deadline:
            assert live.poll() is None, live.communicate()
            time.sleep(0.1)
        second = subprocess.run(_recipe_command(*args), env=_env(), capture_output=True, text=True, timeout=300)
        assert_one_line_error(second, f"in use by another process (pid {live.pid} on host {socket.gethostname()}")
        assert live.poll() is None  # the refused launch left the live run alone
        live.send_signal(signal.SIGTERM)
        _, err = live.communicate(timeout=60)
    finally:
        live.kill()
    assert live.returncode == 143, err
    (line,) = err.splitlines()
    prefix = "error: interrupted by SIGTERM; resume with: "
    assert line.startswith(prefix), line
    python, *command = shlex.split(line.removeprefix(prefix))
    assert python in ("python", sys.executable) and command == _recipe_command(*args)[1:]


def test_ctrl_c_stops_workers_and_prints_the_command_that_resumes(tmp_path):
    """Ctrl-C in a terminal signals the whole process group (main process and collector workers): one line, exit
    130, and the printed command resumes the run to its end."""
    root = tmp_path / "runs"
    args = ("collector.kind=parallel", "collector.total_frames=20480", "logger.log_interval_steps=512",
            "eval.n_envs=0", "logger.wandb=false", "logger.progress_bar=false", f"run.root={root}")
    proc = subprocess.Popen(_recipe_command(*args), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not list(root.rglob("checkpoints/itr_*")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    (line,) = err.splitlines()
    prefix = "error: interrupted by SIGINT; resume with: "
    assert line.startswith(prefix), line
    python, *command = shlex.split(line.removeprefix(prefix))
    run_dir = next(root.rglob("run_0"))
    assert python in ("python", sys.executable) and command == [*_recipe_command(*args)[1:], f"run.dir={run_dir}"]
    resumed = subprocess.run([sys.executable, *command], env=_env(), capture_output=True, text=True, timeout=300,
                             cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from itr_" in resumed.stdout
    assert json.loads((run_dir / "summary.json").read_text())["frames"] >= 20480
