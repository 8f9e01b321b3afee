"""Data-parallel trainer: real 2-rank gloo process groups (spawned), a tiny real PPO recipe on CartPole.

What is checked: parameters bitwise equal across ranks after every update; averaged per-rank gradients equal the
gradient of the concatenated batch (to float tolerance; that is the equality the algorithm allows); a rank that
raises stops the run with its traceback; resume from rank 0's checkpoint on every rank; bad settings rejected
before any process starts. NCCL/CUDA code paths exist but only their error paths run here (no GPU).
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tdrl.config import RecipeConfig
from tdrl.distributed import DataParallelError, DataParallelTrainer, launch_data_parallel
from tdrl.distributed.replicas import GradientAllReduce, broadcast_module_state, replica_digest
from tdrl.train import Schedule
from tdrl.utils.distributed import (
    DistributedSetupError,
    available_cpus,
    is_main_process,
    rank,
    rank_seed,
    resolve_backend,
)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


# --- gradient averaging on a fixed batch ---------------------------------------------------------------------------


def _grad_equality_worker() -> dict:
    torch.manual_seed(0)
    x, y = torch.randn(64, 5), torch.randn(64, 1)
    results = {}
    for opt_name in ("sgd", "adam"):
        torch.manual_seed(1 + rank())  # different init per rank: the broadcast must fix it
        model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
        broadcast_module_state([model])
        reference = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
        reference.load_state_dict(model.state_dict())
        sync = GradientAllReduce([model])
        make = (lambda p: torch.optim.SGD(p, lr=0.1)) if opt_name == "sgd" else (lambda p: torch.optim.Adam(p, lr=1e-2))
        opt, ref_opt = make(model.parameters()), make(reference.parameters())
        half = slice(32 * rank(), 32 * (rank() + 1))
        max_grad_err, max_param_err, equal_across = 0.0, 0.0, []
        for _ in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(x[half]), y[half]).backward()  # mean over this rank's half
            ref_opt.zero_grad()
            nn.functional.mse_loss(reference(x), y).backward()  # single process, doubled (concatenated) batch
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                max_grad_err = max(max_grad_err, float((p.grad - q.grad).abs().max()))
            opt.step()
            ref_opt.step()
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                max_param_err = max(max_param_err, float((p - q).abs().max()))
            digests = [None] * dist.get_world_size()
            dist.all_gather_object(digests, replica_digest([model]))
            equal_across.append(len(set(digests)) == 1)
        sync.remove()
        results[opt_name] = {"grad_err": max_grad_err, "param_err": max_param_err, "equal": equal_across,
                             "reductions": sync.reductions}
    return results


@pytest.mark.timeout(90)
def test_averaged_gradients_equal_gradient_of_concatenated_batch():
    results = launch_data_parallel(_grad_equality_worker, world_size=2)
    for opt_name, r in results.items():
        assert r["reductions"] == 3, opt_name
        assert all(r["equal"]), f"{opt_name}: ranks differ bitwise after an update"
        # mean of the two half-batch mean-gradients == gradient of the 64-sample mean, up to summation order
        assert r["grad_err"] < 1e-6, (opt_name, r)
        assert r["param_err"] < 1e-5, (opt_name, r)


# --- a tiny real recipe: PPO on CartPole, 2 ranks -----------------------------------------------------------------


def _tiny_ppo(run_dir: str, n_steps: int, crash_rank: int = -1, crash_itr: int = -1, digest_file: str = "") -> dict:
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    from tdrl.collect import SerialCollector
    from tdrl.config import LoggerConfig, RunConfig
    from tdrl.envs import EnvFactory
    from tdrl.log import Run
    from tdrl.models.policies import make_actor_critic
    from tdrl.objectives.update import Updater
    from tdrl.utils.seeding import seed_everything

    torch.set_num_threads(1)
    seed = rank_seed(3)
    seed_everything(seed)
    factory = EnvFactory("CartPole-v1")
    ac = make_actor_critic(factory.specs(), hidden_sizes=(16,))
    collector = SerialCollector(factory, ac.actor, batch_B=2, batch_T=32, seed=seed)
    loss = ClipPPOLoss(ac.actor, ac.critic, entropy_coeff=0.01)
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=ac.critic)
    updater = Updater(torch.optim.Adam(loss.parameters(), lr=3e-3), max_grad_norm=0.5)
    run = None
    if is_main_process():
        run = Run.open(config={"test": "ddp"}, run=RunConfig(dir=run_dir),
                       logger=LoggerConfig(log_interval_steps=256, wandb=False, progress_bar=False), name="tiny",
                       tee=False)
    trainer = DataParallelTrainer(collector=collector, modules=[loss], run=run,
                                  checkpoint_state={"model": ac, "updater": updater},
                                  schedule=Schedule(n_steps=n_steps, log_interval_steps=256))
    equal, first_digest = [], None
    for batch in trainer:
        if first_digest is None:
            first_digest = replica_digest([loss])
        if digest_file and trainer.itr == 2 and rank() == 0:
            Path(digest_file).write_text(replica_digest([loss]))
        if rank() == crash_rank and trainer.itr == crash_itr:
            raise RuntimeError(f"injected failure on rank {rank()} at iteration {trainer.itr}")
        with torch.no_grad():
            gae(batch)
        metrics = []
        for _ in range(2):
            for mb in batch.reshape(-1)[torch.randperm(batch.numel())].split(32):
                metrics.append(updater.step(loss(mb)))
                digests = [None] * dist.get_world_size()
                dist.all_gather_object(digests, replica_digest([loss]))
                equal.append(len(set(digests)) == 1)
        trainer.record(metrics, updates=len(metrics))
    return {"equal": equal, "summary": trainer.summary, "history": trainer.history, "resumed": trainer.resumed,
            "first_digest": first_digest, "updates": updater.updates}


def _progress(run_dir: Path) -> list[dict]:
    with open(run_dir / "progress.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(150)
def test_two_rank_ppo_stays_bitwise_identical_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    digest_file = tmp_path / "ckpt_digest.txt"
    n_steps = 128 * 8  # 2 ranks x 64 frames per iteration -> 8 iterations, a row and checkpoint every 2
    # first launch: rank 1 fails at iteration 3, after the checkpoint of iteration 2
    with pytest.raises(DataParallelError, match=r"(?s)^rank 1 of 2 failed.*injected failure on rank 1 at iteration 3"):
        launch_data_parallel(_tiny_ppo, str(run_dir), n_steps, 1, 3, str(digest_file), world_size=2)
    rows = _progress(run_dir)
    assert [int(r["Iteration"]) for r in rows] == [2]
    assert int(rows[0]["CumSteps"]) == 256  # frames of both ranks
    assert not (run_dir / "summary.json").exists()

    # relaunch on the same directory: every rank resumes from rank 0's checkpoint of iteration 2
    out = launch_data_parallel(_tiny_ppo, str(run_dir), n_steps, world_size=2)
    assert out["resumed"]
    assert out["first_digest"] == digest_file.read_text(), "resumed weights differ from the checkpoint's"
    assert out["equal"] and all(out["equal"]), "parameters differed across ranks after some update"
    assert out["updates"] == 8 * 4  # 2 epochs x 2 minibatches per iteration over all 8 iterations
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] == n_steps and summary["world_size"] == 2
    rows = _progress(run_dir)
    assert [int(r["Iteration"]) for r in rows] == [2, 4, 6, 8]
    assert [int(r["CumSteps"]) for r in rows] == [256, 512, 768, 1024]
    assert all(float(r["time/allreduce_s"]) > 0 for r in rows)  # gradients were really all-reduced
    # episode statistics come from both ranks: more episodes than one rank's 2 envs can finish
    assert int(rows[-1]["CumCompletedTrajs"]) > 0
    assert "loss/objective_mean" in rows[-1]


# --- bad input: errors before any process starts -------------------------------------------------------------------


def _never_called(*_: object) -> None:
    raise AssertionError("a rank started although the settings were invalid")


def test_world_size_larger_than_cores_is_refused_before_spawning():
    with pytest.raises(DistributedSetupError, match=r"world_size=\d+ exceeds the \d+ CPU core"):
        launch_data_parallel(_never_called, world_size=available_cpus() + 1)
    with pytest.raises(DistributedSetupError, match="positive int"):
        launch_data_parallel(_never_called, world_size=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error path")
def test_nccl_without_cuda_is_refused():
    with pytest.raises(DistributedSetupError, match="'nccl' needs CUDA"):
        launch_data_parallel(_never_called, world_size=1, backend="nccl", device="cuda")
    with pytest.raises(DistributedSetupError, match="'nccl' needs CUDA"):
        resolve_backend("nccl", "cpu")
    with pytest.raises(DistributedSetupError, match="not a backend"):
        resolve_backend("mpi")
    assert resolve_backend("auto", "cpu") == "gloo"


def test_env_world_size_mismatch_is_refused(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(DistributedSetupError, match="world_size=2 but the launcher started WORLD_SIZE=4"):
        launch_data_parallel(_never_called, world_size=2)


def test_rank_seeds_are_distinct_and_rank_zero_keeps_the_run_seed():
    seeds = [rank_seed(5, r) for r in range(4)]
    assert seeds[0] == 5 and len(set(seeds)) == 4
    assert rank_seed(6, 0) not in seeds[1:]  # seed 6 rank 0 is not seed 5 rank 1


def test_run_on_a_nonzero_rank_is_refused(monkeypatch):
    import tdrl.distributed.data_parallel as data_parallel

    monkeypatch.setattr(data_parallel, "rank", lambda: 1)
    with pytest.raises(ValueError, match="open it on rank 0 only"):
        DataParallelTrainer(collector=object(), modules=[nn.Linear(1, 1)], run=object(), frames_per_itr=1,
                            schedule=Schedule(n_steps=10, log_interval_steps=10))


def test_single_process_world_of_one_runs_in_process():
    assert launch_data_parallel(_pid_and_world, world_size=1) == (os.getpid(), 1)


def _pid_and_world() -> tuple[int, int]:
    return os.getpid(), dist.get_world_size()


_ENV_RANK_SCRIPT = """
import torch, torch.distributed as dist
from tdrl.distributed import launch_data_parallel
from tdrl.distributed.replicas import GradientAllReduce

def fn():
    model = torch.nn.Linear(3, 1)
    GradientAllReduce([model])
    torch.manual_seed(dist.get_rank())
    model(torch.randn(4, 3)).sum().backward()  # per-rank data; the hook averages the gradients
    grads = [None, None]
    dist.all_gather_object(grads, model.weight.grad.tolist())
    return dist.get_rank(), dist.get_world_size(), grads[0] == grads[1]

print("RESULT", launch_data_parallel(fn, world_size=2))
"""


@pytest.mark.timeout(90)
def test_env_rendezvous_like_torchrun_or_slurm(tmp_path):
    """Ranks started by someone else (torchrun; tdrl.launch exports the same variables from SLURM's) join through
    the env:// variables and run the function in their own process."""
    import subprocess
    import sys

    from tdrl.utils.distributed import free_port

    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", _ENV_RANK_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
             for r in range(2)]
    outputs = [p.communicate(timeout=80) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, err[-2000:]
        assert f"RESULT ({r}, 2, True)" in out


def test_make_trainer_refuses_ddp_without_ranks_before_building_the_collector():
    from tdrl.wiring import TrainerConfig, make_trainer

    @dataclass
    class TrainerRecipeConfig(RecipeConfig):
        trainer: TrainerConfig = field(default_factory=TrainerConfig)

    with pytest.raises(ValueError, match="must start its ranks with tdrl.distributed.launch_data_parallel"):
        make_trainer(TrainerRecipeConfig(trainer=TrainerConfig(kind="ddp", world_size=2)), on_policy=True,
                     collector_factory=_never_called, modules=[nn.Linear(1, 1)])
    with pytest.raises(DistributedSetupError, match="trainer.world_size=64 exceeds"):
        make_trainer(TrainerRecipeConfig(trainer=TrainerConfig(kind="ddp", world_size=64)), on_policy=True,
                     collector_factory=_never_called, modules=[nn.Linear(1, 1)])


@pytest.mark.timeout(120)
def test_ppo_recipe_runs_data_parallel_from_its_config(tmp_path):
    """``python recipes/ppo.py trainer.kind=ddp trainer.world_size=2``, with the recipe loaded by path (as
    tdrl.launch and the recipe tests load it): the ranks must find it."""
    from tdrl.config import apply_overrides
    from tdrl.launch.recipe import load_recipe

    ppo = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "ppo.py")
    cfg = apply_overrides(ppo.Config(), [
        "trainer.kind=ddp", "trainer.world_size=2", f"run.dir={tmp_path / 'run'}", "logger.wandb=false",
        "logger.progress_bar=false", "collector.batch_B=2", "collector.batch_T=32", "collector.total_frames=256",
        "logger.log_interval_steps=128", "eval.n_envs=1", "eval.max_steps=30", "loss.epochs=1",
    ])
    summary = ppo.main(cfg)
    assert summary["world_size"] == 2 and summary["frames"] == 256 and summary["iterations"] == 2
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["frames"] == 256
    assert [int(r["CumSteps"]) for r in _progress(tmp_path / "run")] == [0, 128, 256]  # eval row at 0
