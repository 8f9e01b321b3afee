"""A small, deterministic training run used by the resume tests; run it as a subprocess.

    python resume_script.py run.dir=DIR iterations=24 sleep_s=0.05

Every iteration: two CartPole episodes (gymnasium; env seeds drawn from numpy's global RNG, actions sampled
with torch's), transitions into a TorchRL replay buffer on memmap storage, REINFORCE updates plus a value
regression on replay samples (torch RNG), python ``random`` picks the number of value updates, an Adam
optimizer with a StepLR schedule. It logs a progress.csv row and checkpoints at every iteration, with the replay
buffer written through ``extra_writers``. At the end it writes ``final.pt`` (model, optimizer, scheduler state).
Killed at any point and relaunched with the same arguments, it must end bitwise equal to an uninterrupted run.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, ReplayBuffer

from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig, parse_args
from tdrl.log import Run, summarize_columns, summarize_records
from tdrl.utils.seeding import seed_everything


@dataclass
class ScriptConfig:
    iterations: int = 24
    """Training iterations."""
    sleep_s: float = 0.0
    """Pause after each iteration, so a kill can land anywhere."""
    lr: float = 1e-2
    """Adam learning rate."""
    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(
        default_factory=lambda: LoggerConfig(log_interval_steps=1, wandb=False, progress_bar=False)
    )
    checkpoint: CheckpointConfig = field(
        default_factory=lambda: CheckpointConfig(snapshot_mode="last")
    )


def rollout(env: gym.Env, policy: torch.nn.Module) -> tuple[dict, TensorDict]:
    obs, _ = env.reset(seed=int(np.random.randint(2**31 - 1)))
    observations, actions, rewards = [], [], []
    done = False
    while not done:
        o = torch.as_tensor(obs, dtype=torch.float32)
        with torch.no_grad():
            action = torch.distributions.Categorical(logits=policy(o)[:2]).sample()
        obs, reward, terminated, truncated, _ = env.step(int(action))
        observations.append(o)
        actions.append(action)
        rewards.append(float(reward))
        done = terminated or truncated
    returns = torch.tensor(np.cumsum(rewards[::-1])[::-1].copy(), dtype=torch.float32)
    data = TensorDict(
        {
            "observation": torch.stack(observations),
            "action": torch.stack(actions),
            "return": returns,
        },
        batch_size=[len(rewards)],
    )
    return {"return": sum(rewards), "length": len(rewards)}, data


def main(cfg: ScriptConfig) -> None:
    torch.set_num_threads(1)
    seed_everything(cfg.run.seed)
    run = Run.open(
        config=cfg, run=cfg.run, logger=cfg.logger, checkpoint=cfg.checkpoint, name="resume"
    )
    env = gym.make("CartPole-v1")
    policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    optim = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=5, gamma=0.8)
    # The memmap scratch dir is a cache: the checkpoint holds the buffer. TorchRL refuses to reuse existing
    # memmap files, so a relaunch starts from an empty scratch dir and loads the checkpoint's copy.
    shutil.rmtree(run.dir / "replay", ignore_errors=True)
    replay = ReplayBuffer(
        storage=LazyMemmapStorage(4000, scratch_dir=run.dir / "replay"), batch_size=32
    )

    state = run.load_checkpoint(extra_readers={"replay": replay.loads})
    start, frames, updates = 0, 0, 0
    if state is not None:
        policy.load_state_dict(state["policy"])
        optim.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        start, frames, updates = state["iteration"] + 1, state["frames"], state["updates"]

    for itr in range(start, cfg.iterations):
        episodes, batches = zip(*(rollout(env, policy) for _ in range(2)), strict=True)
        data = torch.cat(batches)
        replay.extend(data)
        frames += data.shape[0]
        losses: dict[str, list[float]] = {"loss/pg": [], "loss/value": []}
        logits = policy(data["observation"])
        logp = torch.log_softmax(logits[:, :2], -1).gather(-1, data["action"][:, None]).squeeze(-1)
        loss = -(logp * (data["return"] - data["return"].mean())).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses["loss/pg"].append(loss.item())
        updates += 1
        for _ in range(random.randint(1, 3)):
            batch = replay.sample()
            value_loss = (policy(batch["observation"])[:, 2] - batch["return"] / 100).pow(2).mean()
            optim.zero_grad()
            value_loss.backward()
            optim.step()
            losses["loss/value"].append(value_loss.item())
            updates += 1
        sched.step()
        row = {
            **summarize_records(list(episodes), "train/"),
            **summarize_columns(losses),
            "optim/lr": sched.get_last_lr()[0],
        }
        run.log({"CumUpdates": updates, "NewCompletedTrajs": len(episodes), **row}, step=frames, iteration=itr)
        run.save_checkpoint(
            {
                "iteration": itr,
                "frames": frames,
                "updates": updates,
                "policy": policy.state_dict(),
                "optim": optim.state_dict(),
                "sched": sched.state_dict(),
            },
            itr,
            step=frames,
            extra_writers={"replay": replay.dumps},
        )
        time.sleep(cfg.sleep_s)

    torch.save(
        {
            "policy": policy.state_dict(),
            "optim": optim.state_dict(),
            "sched": sched.state_dict(),
            "frames": frames,
        },
        run.dir / "final.pt",
    )
    run.finish({"train/return_mean": row["train/return_mean"]} if cfg.iterations > start else {})


if __name__ == "__main__":
    main(parse_args(ScriptConfig(), sys.argv[1:], prog="resume_script.py"))
