"""A user's own Ape-X-style loop on tdrl's Ray trainer with plain TorchRL modules and no tdrl model: TorchRL's
``QValueActor`` and ``EGreedyModule`` as the actors' policy, TorchRL's ``DQNLoss`` and ``HardUpdate`` in the learner,
tdrl's collectors and replay. ``python plain_torchrl_apex.py ADDRESS FRAMES SUMMARY_JSON``."""

import functools
import json
import sys
import tempfile

import torch
from tensordict.nn import TensorDictSequential
from torchrl.data import Categorical
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, HardUpdate

from tdrl.collect import make_collector
from tdrl.config import RayConfig
from tdrl.distributed import ActorHooks, RayTrainer
from tdrl.envs import EnvFactory
from tdrl.replay import TRANSITION_KEYS, TransitionReplayBuffer
from tdrl.train import Schedule


def main(address: str, frames: int, summary_path: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    q_actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[32, 32]), in_keys=["observation"],
                          spec=Categorical(2))
    policy = TensorDictSequential(q_actor, EGreedyModule(Categorical(2), eps_init=0.1, eps_end=0.1))
    loss = DQNLoss(q_actor, delay_value=True)
    loss.make_value_estimator(gamma=0.99)
    target = HardUpdate(loss, value_network_update_interval=50)
    optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        replay = TransitionReplayBuffer(f"{tmp}/replay", 10_000, keys=TRANSITION_KEYS, seed=0)
        factory = functools.partial(make_collector, "serial", EnvFactory("CartPole-v1"), policy, batch_B=1, batch_T=8)
        trainer = RayTrainer(collector_factory=factory, policy=policy, replay=replay, updates_per_sync=4,
                             schedule=Schedule(n_steps=frames, log_interval_steps=512, replay_ratio=8, batch_size=32,
                                               min_steps_learn=256),
                             ray=RayConfig(n_actors=2, ray_address=address, actor_cpus=1, call_timeout_s=20),
                             hooks=ActorHooks(weights_module=q_actor))
        losses = []
        for _ in trainer:
            for _ in range(trainer.updates_due):
                out = loss(replay.sample(32))
                optimizer.zero_grad()
                out["loss"].backward()
                optimizer.step()
                target.step()
                losses.append(out["loss"].item())
            trainer.record(updates=trainer.updates_due)
        summary = {**trainer.summary, "first_losses": losses[:20], "last_losses": losses[-20:]}
    with open(summary_path, "w") as f:
        json.dump(summary, f, default=str)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
