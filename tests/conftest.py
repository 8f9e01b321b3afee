"""Test-wide settings: no network for W&B, headless rendering, one torch thread, no stray MuJoCo logs."""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _run_in_tmp_cwd(tmp_path, monkeypatch):
    """Each test runs in its own directory: MuJoCo writes MUJOCO_LOG.TXT into the cwd, runs default to ./runs.
    Each starts with IEEE denormals and one torch thread too: a recipe run in this process sets
    ``run.flush_denormal`` (default true) and ``run.torch_threads`` (dqn/sac/td3: 2, which on a core the other test
    worker uses made the next tests' small updates 10-50x slower)."""
    monkeypatch.chdir(tmp_path)
    torch.set_flush_denormal(False)
    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """The tests that start or use a cluster (the local SLURM cluster, the Ray clusters in network namespaces) run
    one after another in a single worker of ``pytest -n 2 --dist loadgroup`` (``make test``): they share the SLURM
    queue and the namespaces' addresses. Every other test goes to whichever worker is free."""
    for item in items:
        if item.get_closest_marker("slurm") or item.get_closest_marker("distributed"):
            item.add_marker(pytest.mark.xdist_group("clusters"))
