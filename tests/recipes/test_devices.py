"""Every recipe's update path reads no value back to the host (values are read at log rows and checkpoints only).

On the CPU the update path of a tiny run is wrapped in a sentinel that fails on ``Tensor.item``, ``bool``,
``float``, ``tolist``, ``numpy``, ``cpu`` (tests/host_reads.py): the device half (``update_step``'s function: loss,
backward, clip, optimizer step, NaN guard) and the host half (``Updater.advance``, ``TargetUpdate.step``). With CUDA
(``gpu``) every recipe runs with ``run.device=cuda`` under ``torch.cuda.set_sync_debug_mode("error")`` around the
same calls, which also sees reads inside torch's C++, and the off-policy recipes with ``optim.cudagraphs=true``.
Two reads remain, each pinned by a test: prioritized replay reads its new priorities back after the update (the sum
tree is on the host; the runs here use uniform replay), and R2D1's recurrent Q-network reads where episodes start
inside its sequences, to run the LSTM once per stretch between them (tdrl/models/recurrent_q.py).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from host_reads import HostReadError, forbid_host_reads

from tdrl.config import ConfigError
from tdrl.objectives import graphs
from tdrl.objectives.update import TargetUpdate, Updater
from tests.recipes import (
    test_a2c,
    test_continuous_control,
    test_dqn,
    test_impala,
    test_maddpg,
    test_ppo,
    test_qmix,
    test_r2d1,
)

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")

RECIPES = {  # name: (recipe module, its tests' tiny config, overrides for uniform replay and a fused optimizer)
    "dqn": (test_dqn.dqn, test_dqn.tiny, []),
    **{name: (test_continuous_control.MODULES[name], functools.partial(test_continuous_control.tiny, name), [])
       for name in ("sac", "td3", "ddpg")},
    "ppo": (test_ppo.ppo, test_ppo.tiny, []),
    # the CNN actor-critic: uint8 frames to the device, scaled there; one torso pass per minibatch
    "ppo_atari": (test_ppo.ppo, test_ppo.tiny, ["env.id=ALE/Pong-v5", "loss.clip_reward=true", "collector.batch_B=2",
                                                "collector.batch_T=64", "eval.n_envs=1", "eval.max_steps=30"]),
    "a2c": (test_a2c.a2c, test_a2c.tiny, ["optim.name=adam"]),
    "impala": (test_impala.impala, test_impala.tiny, ["optim.name=adam"]),
    "qmix": (test_qmix.qmix, test_qmix.tiny, []),  # grouped transitions, a mixer and its target
    # grouped transitions, TorchRL's DDPGLoss with the agent mask, MultiAgentMLP critics (not masac: TorchRL's
    # TanhNormal, built in each SACLoss call, reads (high != 1).any() and its bounds' check back to the host)
    "maddpg": (test_maddpg.maddpg, test_maddpg.tiny, []),
}
OFF_POLICY = ["dqn", "sac", "td3", "ddpg", "qmix"]


def _guard_updates(monkeypatch, guard: Callable[[str], contextlib.AbstractContextManager]) -> list[str]:
    """Run every update's device half and host half inside ``guard(where)``; returns the names of the calls."""
    calls: list[str] = []
    real_update_step = graphs.update_step

    def update_step(fn, **kwargs):
        step = real_update_step(fn, **kwargs)

        def guarded(sample):
            calls.append("learn")
            with guard("the device half of an update"):
                return step(sample)
        return guarded

    def wrap(cls, name):
        method = getattr(cls, name)

        def guarded(self, *args, **kwargs):
            calls.append(name)
            with guard(f"{cls.__name__}.{name}"):
                return method(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, guarded)

    monkeypatch.setattr(graphs, "update_step", update_step)  # recipes import it when main runs
    wrap(Updater, "advance")
    wrap(TargetUpdate, "step")
    return calls


def _run(name, tmp_path, *extra):
    if name.endswith("_atari"):
        pytest.importorskip("ale_py", reason="needs ale-py: pip install 'tdrl[atari]'")
    if name in ("qmix", "maddpg"):
        pytest.importorskip("mpe2", reason="needs mpe2: pip install 'tdrl[marl]'")
    recipe, tiny, overrides = RECIPES[name]
    return recipe.main(tiny(tmp_path, *overrides, *extra))


@pytest.mark.parametrize("name", list(RECIPES))
def test_update_path_reads_nothing_back_to_the_host(name, tmp_path, monkeypatch):
    calls = _guard_updates(monkeypatch, forbid_host_reads)
    summary = _run(name, tmp_path)
    assert summary["updates"] > 0 and calls.count("learn") >= summary["updates"] and "advance" in calls


def test_the_sentinel_sees_a_host_read_in_a_recipe_update(tmp_path, monkeypatch):
    """A2C's default RMSprop has no fused step: its updater reads the skip flag on the host, and the sentinel
    must catch that read inside the recipe."""
    _guard_updates(monkeypatch, forbid_host_reads)
    recipe, tiny, _ = RECIPES["a2c"]
    with pytest.raises(HostReadError, match=r"Tensor.__bool__\(\) .* device half of an update"):
        recipe.main(tiny(tmp_path))


def test_r2d1_reads_where_episodes_start_in_its_sequences(tmp_path, monkeypatch):
    _guard_updates(monkeypatch, forbid_host_reads)
    with pytest.raises(HostReadError, match=r"Tensor.tolist\(\)") as err:
        test_r2d1.r2d1.main(test_r2d1.tiny(tmp_path, "replay.prioritized=false"))
    assert err.traceback[-2].path.name == "recurrent_q.py"


@pytest.mark.parametrize("name", OFF_POLICY)
def test_device_settings_that_cannot_work_are_config_errors(name, tmp_path):
    _, tiny, _ = RECIPES[name]
    with pytest.raises(ConfigError, match=r"optim.cudagraphs=true replays CUDA graphs, but run.device='cpu'"):
        tiny(tmp_path, "optim.cudagraphs=true")
    with pytest.raises(ConfigError, match=r"replay.device=cuda keeps a copy of the replay on the GPU, but run.dev"):
        tiny(tmp_path, "replay.device=cuda")
    if name in ("dqn", "sac"):  # the recipes with an async trainer
        with pytest.raises(ConfigError, match=r"replay.device=cuda needs trainer.kind=sync"):
            tiny(tmp_path, "run.device=cuda", "replay.device=cuda", "trainer.kind=async")


def test_replay_device_chooses_the_copy():
    from tdrl.config import replay_copy

    cfg = test_dqn.tiny(Path("."))
    assert replay_copy(cfg) is None  # auto: the buffer decides by size, on a GPU only
    for value, kind, copy in [("cuda", "sync", True), ("cpu", "sync", False), ("auto", "async", False)]:
        cfg.replay.device, cfg.trainer.kind = value, kind
        assert replay_copy(cfg) is copy


@contextlib.contextmanager
def _no_sync(where: str):
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


CUDA_RUNS = [(name, []) for name in RECIPES] + [(name, ["optim.cudagraphs=true"]) for name in OFF_POLICY] + [
    *[(name, ["replay.device=cpu"]) for name in OFF_POLICY],  # host gathers, pinned copies (auto copies these)
    ("dqn", ["optim.cudagraphs=true", "optim.lr_final=1e-5"]),  # the lr schedule reaches the captured step
    # the policy on the GPU, envs stepping in CPU workers
    ("sac", ["collector.kind=action_server", "collector.batch_B=2", "collector.n_workers=2"]),
]


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name, extra", CUDA_RUNS, ids=[f"{n}-{'-'.join(e) or 'defaults'}" for n, e in CUDA_RUNS])
def test_cuda_run_never_syncs_in_an_update(name, extra, tmp_path, monkeypatch):
    calls = _guard_updates(monkeypatch, _no_sync)
    summary = _run(name, tmp_path, "run.device=cuda", *extra)
    assert summary["updates"] > 0 and calls.count("learn") >= summary["updates"]
    assert summary["eval/return_mean"] == summary["eval/return_mean"]  # evaluated on the GPU: not NaN


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_r2d1_syncs_only_where_episodes_start(tmp_path, monkeypatch):
    _guard_updates(monkeypatch, _no_sync)
    with pytest.raises(RuntimeError, match="synchronizing CUDA operation") as err:
        test_r2d1.r2d1.main(test_r2d1.tiny(tmp_path, "replay.prioritized=false", "run.device=cuda"))
    assert any(entry.path.name == "recurrent_q.py" for entry in err.traceback)


CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("first, then", [
    ("cpu", "cpu"), pytest.param("cuda", "cpu", marks=CUDA), pytest.param("cpu", "cuda", marks=CUDA)])
@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_checkpoint_resumes_on_the_other_device(name, first, then, tmp_path):
    """A run checkpointed on one device continues on the other: models, optimizer state (fused Adam's step on the
    parameters' device), replay and RNGs load through map_location="cpu"; CUDA RNG states only where CUDA is
    (cpu -> cpu runs the same path here)."""
    recipe, tiny, overrides = RECIPES[name]
    run_dir = tmp_path / "run"
    half = recipe.main(tiny(tmp_path, *overrides, f"run.dir={run_dir}", f"run.device={first}"))
    total = 2 * half["frames"]
    resumed = recipe.main(tiny(tmp_path, *overrides, f"run.dir={run_dir}", f"run.device={then}",
                               f"collector.total_frames={total}", "run.force=true"))
    assert resumed["frames"] == total and resumed["updates"] > half["updates"]
    assert resumed["eval/return_mean"] == resumed["eval/return_mean"]
