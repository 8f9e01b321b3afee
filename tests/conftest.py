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
    """Each test runs in its own directory: MuJoCo writes MUJOCO_LOG.TXT into the cwd, runs default to ./runs."""
    monkeypatch.chdir(tmp_path)
