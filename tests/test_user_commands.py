"""Small promises, each checked as the command a user types: ``--help`` lists only the trainer kinds (and their keys)
a recipe accepts; a Ray address is ``host:port`` and a bad one is blamed on where it came from; a folder of other
files is not taken as ``run.dir``; a finished run relaunched says so and changes nothing; SIGTERM checkpoints at the
next iteration of every trainer, then prints the command that resumes; ``make gpu-check`` fetches its wheels or says
in one line why it cannot; the README's install line gives the CPU build of torch on a stock pip."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_PPO = ["collector.total_frames=512", "logger.log_interval_steps=256", "eval.n_envs=0", "logger.wandb=false",
            "logger.progress_bar=false"]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TDRL_DEBUG": "0", **extra}


def recipe(name: str, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    """``python recipes/<name> ARGS``, as typed (the environment gets ``extra_env``)."""
    return subprocess.run([sys.executable, str(ROOT / "recipes" / name), *args], capture_output=True, text=True,
                          env=env(**extra_env), timeout=300)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused launch (exit status 2), without its ``error: `` prefix."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: "), line
    return line.removeprefix("error: ")


def tree(directory: Path) -> dict[str, str]:
    """Every entry under ``directory``: files by sha256, folders as such."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(directory.rglob("*"))}


# --- --help lists what the recipe accepts ---------------------------------------------------------------------------

ACCEPTS = {"ppo.py": {"sync", "ddp"}, "a2c.py": set(), "impala.py": {"sync", "ray"},
           "dqn.py": {"sync", "async", "ray"}, "ddpg.py": {"sync", "async", "ray"}, "td3.py": set(),
           "sac.py": {"sync", "async"}, "r2d1.py": {"sync", "async"}}
KINDS = ("sync", "ddp", "async", "ray")


@pytest.mark.parametrize("name", sorted(ACCEPTS))
def test_help_lists_only_the_trainer_kinds_the_recipe_accepts_and_their_keys(name):
    """``python recipes/<x>.py --help``: ``trainer.kind`` offers the kinds the recipe wires up, and no key is
    documented as one of a kind it refuses (``ray: ...``, ``async, ray: ...``, ``trainer.kind=ray: ...``)."""
    proc = recipe(name, "--help")
    assert proc.returncode == 0, proc.stderr
    offered = re.search(r"^  trainer\.kind \(\{([a-z,]+)\}\)", proc.stdout, flags=re.M)
    assert set(offered.group(1).split(",") if offered else ()) == ACCEPTS[name], proc.stdout
    for line in proc.stdout.splitlines():
        key = re.match(r"^  (\S+) \(.*?\) = \S+  (.*)$", line)
        if key is None or key.group(1) == "trainer.kind":
            continue
        scope = key.group(2).split(":", 1)[0]
        named = {kind for kind in KINDS if re.search(rf"\b{kind}\b", scope)} if len(scope) < 40 else set()
        assert named <= ACCEPTS[name], f"{name}: {key.group(1)} is documented for {named}"


def test_a_kind_the_help_does_not_list_is_refused_in_one_line():
    assert one_line_error(recipe("ppo.py", "trainer.kind=ray")) == \
        "config key 'trainer.kind': 'ray' is not one of ['sync', 'ddp']"
    assert "unknown config key 'trainer.n_actors'" in one_line_error(recipe("ppo.py", "trainer.n_actors=4"))


# --- Ray addresses: host:port, blamed on where they came from --------------------------------------------------------


def test_a_ray_address_that_is_not_host_port_names_the_key(tmp_path):
    start = time.perf_counter()
    proc = recipe("dqn.py", "trainer.kind=ray", "trainer.ray_address=localhost", f"run.root={tmp_path / 'runs'}")
    assert one_line_error(proc).startswith("trainer.ray_address='localhost' is not host:port (e.g. 10.0.0.5:6379")
    assert time.perf_counter() - start < 10  # a config error: before torch loads
    assert not (tmp_path / "runs").exists()


def test_a_bad_ray_address_environment_variable_is_blamed_on_it(tmp_path):
    pytest.importorskip("ray")
    runs = tmp_path / "runs"
    proc = recipe("dqn.py", "trainer.kind=ray", f"run.root={runs}", RAY_ADDRESS="localhost")
    line = one_line_error(proc)
    assert line.startswith("RAY_ADDRESS='localhost' is not host:port") and "unset RAY_ADDRESS" in line, line
    assert "trainer.ray_address" not in line
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = recipe("dqn.py", "trainer.kind=ray", f"run.root={runs}", RAY_ADDRESS=f"127.0.0.1:{port}")
    assert one_line_error(proc).startswith(f"RAY_ADDRESS=127.0.0.1:{port}: no Ray cluster answers there")
    assert not runs.exists()  # nothing written


# --- run.dir: a folder of other files is refused; a finished run is left alone -----------------------------------


def test_a_folder_of_other_files_is_refused_as_run_dir_unless_forced(tmp_path):
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "chapter1.tex").write_text("\\section{Introduction}")
    before = tree(folder)
    line = one_line_error(recipe("ppo.py", *TINY_PPO, f"run.dir={folder}"))
    assert line == (f"run.dir='{folder}' is a folder of other files, not a tdrl run ('chapter1.tex'); choose a new or "
                    "empty run.dir, or pass run.force=true to write the run there anyway")
    assert tree(folder) == before  # nothing written
    forced = recipe("ppo.py", *TINY_PPO, f"run.dir={folder}", "run.force=true")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert (folder / "summary.json").is_file() and (folder / "chapter1.tex").read_text() == "\\section{Introduction}"
    (tmp_path / "empty").mkdir()  # an empty folder is a new run's
    assert recipe("ppo.py", *TINY_PPO, f"run.dir={tmp_path / 'empty'}").returncode == 0


def test_a_finished_run_relaunched_says_so_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    first = recipe("ppo.py", *TINY_PPO, f"run.dir={run_dir}")
    assert first.returncode == 0, first.stderr[-3000:]
    before = tree(run_dir)
    again = recipe("ppo.py", *TINY_PPO, f"run.dir={run_dir}")
    assert again.returncode == 0 and again.stderr == "", again.stderr[-3000:]
    assert again.stdout.splitlines()[-1] == (f"tdrl: run {run_dir} already finished; nothing to do, nothing changed "
                                             f"(summary: {run_dir / 'summary.json'})")
    assert tree(run_dir) == before


# --- SIGTERM: a checkpoint at the next iteration, then the resume line -------------------------------------------

DQN = ["collector.total_frames=1000000", "logger.log_interval_steps=1000", "eval.n_envs=0", "logger.wandb=false",
       "logger.progress_bar=false", "optim.min_steps_learn=16", "optim.batch_size=16", "optim.replay_ratio=4",
       "replay.size=2000", "model.hidden_sizes=[16]", "run.torch_threads=1"]


def checkpoint_itrs(run_dir: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("itr_")) for p in (run_dir / "checkpoints").glob("itr_*"))


def sigterm_when(command: list[str], out: Path, ready) -> tuple[int, str]:
    """Start ``command`` (stdout to ``out``), SIGTERM it once ``ready()``; ``(exit status, stderr)``."""
    with open(out, "w") as stdout:
        proc = subprocess.Popen(command, env=env(), stdout=stdout, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while not ready():
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    return proc.returncode, err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sigterm_checkpoints_at_the_next_iteration_and_the_relaunch_resumes_there(tmp_path, kind):
    """``python recipes/dqn.py ...`` sent SIGTERM between two interval checkpoints: exit 143 with the command that
    resumes, a checkpoint newer than the interval one; that command resumes from it."""
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "recipes" / "dqn.py"), f"trainer.kind={kind}", *DQN, f"run.dir={run_dir}"]
    first: dict[str, float] = {}  # the first interval checkpoint and when it was seen

    def a_second_after_an_interval_checkpoint() -> bool:
        if not first and (run_dir / "checkpoints").is_dir() and (itrs := checkpoint_itrs(run_dir)):
            first.update(itr=itrs[-1], seen=time.monotonic())
        return bool(first) and time.monotonic() > first["seen"] + 1.0

    status, err = sigterm_when(command, tmp_path / "first.out", a_second_after_an_interval_checkpoint)
    assert status == 143, err[-3000:]
    (line,) = err.splitlines()
    prefix = "error: interrupted by SIGTERM; resume with: "
    assert line.startswith(prefix), line
    newest = checkpoint_itrs(run_dir)[-1]
    assert newest > first["itr"], (first, checkpoint_itrs(run_dir))
    _, *resume = shlex.split(line.removeprefix(prefix))
    assert resume == command[1:]  # run.dir was given: the same command

    out = tmp_path / "second.out"
    status, err = sigterm_when([sys.executable, *resume], out, lambda: "tdrl: resumed from" in out.read_text())
    assert status == 143, err[-3000:]
    assert f"tdrl: resumed from itr_{newest:08d} (iteration {newest}," in out.read_text()


# --- make gpu-check: one command, or one line that says why not --------------------------------------------------


def make(*args: str, cwd: Path, **extra_env: str) -> subprocess.CompletedProcess:
    """``make -f <repo>/Makefile ARGS`` in ``cwd``: a folder without ``.whl/``, so nothing of the repository's is
    used or changed."""
    shell = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}  # as typed in a
    # shell, not as a sub-make of `make test` (whose trailer line would read make[1]: ...)
    return subprocess.run(["make", "-f", str(ROOT / "Makefile"), f"PY={sys.executable}", *args], cwd=cwd,
                          capture_output=True, text=True, env={**shell, **extra_env}, timeout=300)


def test_make_gpu_check_fetches_the_wheels_first_when_they_are_missing(tmp_path):
    proc = make("-n", "gpu-check", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    download, install = proc.stdout.find("pip download"), proc.stdout.find("pip install")
    assert 0 <= download < install, proc.stdout


def test_make_gpu_check_where_pip_cannot_download_ends_in_one_line(tmp_path):
    """No package index (as on the lent GPU machine) and no ``.whl/``: one line that says what to do."""
    nothing = tmp_path / "no-index"
    nothing.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    proc = make("gpu-check", cwd=work, PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(nothing))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    ours = [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")]  # make's own trailer
    assert len(ours) == 1 and ours[0].startswith(
        "error: the GPU check needs its wheels in .whl/ and pip could not download them here (ERROR: "), proc.stderr
    assert ours[0].endswith("run make gpu-wheels where pip reaches a package index and copy .whl/ here")
    assert proc.stdout == "" and not list(work.iterdir())  # no pip log, no partial .whl/


# --- The README's install line --------------------------------------------------------------------------------------


def test_readme_install_line_gets_the_cpu_build_on_a_stock_pip(tmp_path):
    """The line names PyTorch's CPU index and the CUDA variant beside it; where that index is reachable, a pip with
    no configuration resolves it to the ``+cpu`` build."""
    (line,) = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("pip install torch")]
    command, _, comment = line.partition("  #")
    assert "--index-url https://download.pytorch.org/whl/cpu" in command and "CUDA: whl/cu" in comment, line
    try:
        socket.create_connection(("download.pytorch.org", 443), timeout=5).close()
    except OSError as e:
        pytest.skip(f"download.pytorch.org is not reachable from here ({e})")
    stock = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", *shlex.split(command), "--dry-run", "--ignore-installed",
                           "--no-deps", "--report", str(report)], capture_output=True, text=True, env=stock,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"version": "2.13.0+cpu"' in report.read_text()
