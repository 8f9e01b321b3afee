"""PPO: Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347), rlpyt's semantics on TorchRL.

Clipped-ratio policy gradient, several epochs over minibatches of each collector batch, GAE advantages (bootstrapped
through time limits: ``truncated`` keeps the next-state value, ``terminated`` drops it), linear decay of the
learning rate and of the ratio clip to 0 over the run (rlpyt's ``linear_lr_schedule``). Feed-forward or LSTM
policies; the recurrent one replays each env's ``[T]`` sequence from the state stored at its first step, and
minibatches split envs rather than steps (rlpyt). Defaults solve CartPole-v1 (eval return 500) in about 20k frames:
RL-Zoo's hyperparameters (8 envs x 32 steps, gamma 0.98, lambda 0.8, linear LR and clip 0.2 decay) with half the
epochs (10) at a higher learning rate (4e-3), which needs about half the gradient updates to reach the threshold.

    python recipes/ppo.py                                             # CartPole-v1
    python recipes/ppo.py collector.kind=parallel collector.n_workers=2
    python recipes/ppo.py model.lstm=true                             # recurrent PPO
    python recipes/ppo.py trainer.kind=ddp trainer.world_size=2       # data-parallel: 2 replicas, gradients averaged
    python recipes/ppo.py --help                                      # every key

HalfCheetah-v5 (benchmark, not CI; RL-Zoo's hyperparameters, observations and rewards normalised as SB3's
VecNormalize does)::

    python recipes/ppo.py env.id=HalfCheetah-v5 collector.total_frames=1000000 collector.batch_B=1 \
        collector.batch_T=512 model.hidden_sizes=[256,256] model.activation=relu model.init_log_std=-2 \
        model.distribution=normal model.normalize_observation=true loss.gamma=0.98 loss.gae_lambda=0.92 \
        loss.epochs=20 loss.minibatches=8 loss.clip_epsilon=0.1 loss.linear_decay=false optim.lr=2e-5 \
        optim.max_grad_norm=0.8 loss.value_loss_coeff=1.16 loss.entropy_coeff=0.0004 loss.normalize_reward=true \
        eval.n_envs=5 logger.log_interval_steps=25000

Atari (needs ``pip install 'tdrl[atari]'``): image observations get a CNN actor-critic (the Nature-DQN torso shared
by the policy and value heads, CleanRL's), frames stay uint8 up to the model. CleanRL's ``ppo_atari_envpool.py``
settings: 8 envs x 128 steps, 4 epochs of 4 minibatches, lr 2.5e-4 decayed linearly, clip 0.1, entropy 0.01,
value loss 0.5 (CleanRL's 0.5 on ``0.5 (V - R)^2``), gamma 0.99, lambda 0.95, grad norm 0.5, 10M agent steps, on
envpool's Atari (``PongNoFrameskip-v4`` here: no sticky actions, 30 no-op starts, 4 frames skipped and stacked;
lives and clipped rewards as envpool's ``episodic_life`` and ``reward_clip``)::

    python recipes/ppo.py env.id=PongNoFrameskip-v4 env.episodic_lives=true loss.clip_reward=true \
        collector.batch_B=8 collector.batch_T=128 collector.total_frames=10000000 loss.epochs=4 loss.minibatches=4 \
        optim.lr=2.5e-4 loss.clip_epsilon=0.1 loss.entropy_coeff=0.01 loss.value_loss_coeff=0.5 loss.gamma=0.99 \
        loss.gae_lambda=0.95 optim.max_grad_norm=0.5 eval.max_steps=27000 logger.log_interval_steps=100000

CleanRL's "Pong in 5-10 minutes" variant of it: ``collector.batch_B=16 loss.epochs=3 loss.minibatches=8
loss.clip_epsilon=0.2``. Two differences remain: ``loss.linear_decay`` decays the clip with the learning rate
(baselines' PPO2 Atari schedule; CleanRL keeps the clip fixed), and the value loss is not clipped. Add
``run.device=cuda`` for the GPU (the model and the update there; the envs step on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tdrl.config import (
    ActorCriticModelConfig,
    AtariEnvConfig,
    CollectorConfig,
    ConfigError,
    Count,
    Fraction,
    LoggerConfig,
    OnPolicyTrainerConfig,
    PolicyGradientLossConfig,
    PolicyGradientOptimConfig,
    PositiveFloat,
    PositiveFraction,
    RecipeConfig,
    run_recipe,
)

if TYPE_CHECKING:  # torch, TensorDict and TorchRL load inside main, after the config is checked
    import torch
    from tensordict import TensorDictBase

    from tdrl.objectives.advantage import ReturnNorm


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class LossConfig(PolicyGradientLossConfig):
    gamma: PositiveFraction = 0.98
    gae_lambda: Fraction = 0.8
    """GAE lambda (1.0 = discounted return with bootstrap, rlpyt's default)."""
    clip_epsilon: PositiveFloat = 0.2
    """Likelihood-ratio clip (rlpyt ratio_clip)."""
    linear_decay: bool = True
    """Decay the learning rate and the ratio clip linearly to 0 over the run (rlpyt linear_lr_schedule)."""
    epochs: Count = 10
    """Passes over each batch."""
    minibatches: Count = 1
    """Minibatches per epoch (split over envs for LSTM policies)."""
    normalize_advantage: bool = True
    """Normalise advantages per minibatch."""
    reward_scale: PositiveFloat = 1.0
    """Multiply rewards by this before computing advantages (returns in the logs stay raw)."""
    normalize_reward: bool = False
    """Instead of a fixed scale, divide rewards by the running std of each env's discounted return and clip at 10
    (SB3's VecNormalize reward normalisation; checkpointed). Returns in the logs stay raw."""

    def validate(self) -> None:
        if self.normalize_reward and self.reward_scale != 1.0:  # the normaliser would undo the scale
            raise ConfigError(f"loss.reward_scale={self.reward_scale} has no effect with loss.normalize_reward=true "
                              "(rewards are divided by their return's running std); set one of them")


@dataclass
class OptimConfig(PolicyGradientOptimConfig):
    lr: PositiveFloat = 4e-3
    """Adam learning rate (start value when decayed)."""


@dataclass
class PPOCollectorConfig(CollectorConfig):
    """The training collector and the run's budget."""

    obs_norm: bool = False
    """TorchRL's VecNorm on the observations, in the collector (per worker, checkpointed); evaluation normalises
    with worker 0's statistics as they stand, frozen."""


@dataclass
class Config(RecipeConfig):
    env: AtariEnvConfig = field(default_factory=AtariEnvConfig)
    collector: PPOCollectorConfig = field(default_factory=PPOCollectorConfig)
    """Training collector and budget."""
    model: ActorCriticModelConfig = field(default_factory=ActorCriticModelConfig)
    """Actor-critic networks."""
    loss: LossConfig = field(default_factory=LossConfig)
    """PPO objective and its schedule."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval_steps=5_000))
    trainer: OnPolicyTrainerConfig = field(default_factory=OnPolicyTrainerConfig)
    """sync, or ddp (trainer.kind=ddp trainer.world_size=2: one replica per process, gradients all-reduced)."""


# --- Update helpers -------------------------------------------------------------------------------------------
def shape_rewards(batch: TensorDictBase, loss: LossConfig, reward_norm: ReturnNorm | None) -> None:
    """The rewards the update learns from, in place (TrajInfos keep the raw ones): Atari's clipped to [-1, 1]
    (``loss.clip_reward``), then divided by their return's running std (``loss.normalize_reward``) or scaled
    (``loss.reward_scale``)."""
    if loss.clip_reward:
        batch["next", "reward"] = batch["next", "reward"].clamp(-1, 1)
    if reward_norm is not None:
        reward_norm(batch)
    else:
        batch["next", "reward"] = batch["next", "reward"] * loss.reward_scale


def minibatches(data: TensorDictBase, n: int, device: torch.device) -> list[TensorDictBase]:
    """``n`` random minibatches over the first dim: steps of the flat batch, or envs (recurrent: whole sequences)."""
    import torch

    if n == 1:  # one full-batch gradient: the order does not matter
        return [data]
    return [data[idx] for idx in torch.randperm(data.shape[0], device=device).chunk(n)]


# --- Recipe ---------------------------------------------------------------------------------------------------
def main(cfg: Config) -> dict:
    # torch, TorchRL and the envs load here, after the config is checked (a bad key fails in < 1 s)
    import torch
    from torchrl.envs import VecNorm
    from torchrl.modules import set_recurrent_mode

    from tdrl.distributed import launch_data_parallel
    from tdrl.log.run import Run
    from tdrl.models import actor_critic_from
    from tdrl.objectives.advantage import GAE, ReturnNorm
    from tdrl.objectives.graphs import update_step
    from tdrl.objectives.policy_gradient import make_ppo_loss
    from tdrl.objectives.schedules import LinearSchedule
    from tdrl.objectives.update import Updater
    from tdrl.utils.distributed import is_distributed, is_main_process, rank_seed
    from tdrl.wiring import check_trainer, collector_factory_from, eval_collector_from, make_trainer, prepare_recipe

    check_trainer(cfg.trainer, on_policy=True, device=cfg.run.device)  # before any process starts
    if cfg.trainer.kind == "ddp" and not is_distributed():  # start the ranks; each runs main(cfg)
        return launch_data_parallel(main, cfg, world_size=cfg.trainer.world_size, backend=cfg.trainer.backend,
                                    device=cfg.run.device)
    # --- Build ----------------------------------------------------------------------------------------------
    device, env_factory = prepare_recipe(cfg, seed=rank_seed(cfg.run.seed))  # ddp ranks > 0: their own streams
    specs = env_factory.specs()  # checks the action space against model.distribution before any collector starts
    ac = actor_critic_from(specs, cfg.model).to(device)  # feed-forward, or recurrent with model.lstm

    advantage = GAE(ac.critic, gamma=cfg.loss.gamma, lmbda=cfg.loss.gae_lambda)  # TorchRL's GAE, one critic call
    # TorchRL's ClipPPOLoss terms; on plain tensors for feed-forward models (same values, less overhead)
    loss = make_ppo_loss(ac, clip_epsilon=cfg.loss.clip_epsilon, entropy_coeff=cfg.loss.entropy_coeff,
                         critic_coeff=0.5 * cfg.loss.value_loss_coeff,
                         normalize_advantage=cfg.loss.normalize_advantage).to(device)
    updater = Updater(torch.optim.Adam(loss.parameters(), lr=cfg.optim.lr, eps=cfg.optim.eps, fused=True),
                      max_grad_norm=cfg.optim.max_grad_norm)

    reward_norm = ReturnNorm(cfg.collector.batch_B, gamma=cfg.loss.gamma).to(device) \
        if cfg.loss.normalize_reward else None

    run = Run.open(cfg, name="ppo") if is_main_process() else None
    collector = collector_factory_from(cfg, env_factory, ac.actor, seed=rank_seed(cfg.run.seed), device=device,
                                       transform=VecNorm(in_keys=["observation"]) if cfg.collector.obs_norm else None)()
    # each evaluation: n_envs whole greedy episodes on their own envs, observations as the collector's; rank 0
    eval_collector = eval_collector_from(cfg, ac.greedy, observations_of=collector) if is_main_process() else None
    trainer = make_trainer(cfg, on_policy=True, collector=collector, modules=[loss], eval_collector=eval_collector,
                           run=run, checkpoint_state={"model": ac, "updater": updater,
                                                      **({"reward_norm": reward_norm} if reward_norm else {})})
    decay = LinearSchedule(1.0, 0.0 if cfg.loss.linear_decay else 1.0, duration=trainer.n_itr)

    # --- Update ---------------------------------------------------------------------------------------------
    compute_loss = torch.compile(loss) if cfg.optim.compile else loss

    def learn(minibatch):  # the device half of an update
        with set_recurrent_mode(ac.recurrent):
            return updater.apply(compute_loss(minibatch))

    learn = update_step(learn, cudagraphs=False, device=device)

    def update(batch):
        shape_rewards(batch, cfg.loss, reward_norm)
        advantage(batch)  # writes state_value, advantage and value_target (time limits bootstrap, terminations not)
        # feed-forward: only what the loss reads, flattened once (cheaper to index); recurrent: [B, T] sequences
        data = batch if ac.recurrent else batch.select(*loss.in_keys).reshape(-1)
        metrics = []
        for _ in range(cfg.loss.epochs):
            for minibatch in minibatches(data, cfg.loss.minibatches, device):
                metrics.append(learn(minibatch))
                updater.advance()
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    for batch in trainer:
        updater.lr = cfg.optim.lr * decay(trainer.itr)
        loss.clip_epsilon.fill_(cfg.loss.clip_epsilon * decay(trainer.itr))
        metrics = update(batch)
        if ac.obs_norm is not None:  # after the update, so this batch was collected and trained with one normaliser
            ac.obs_norm.update(batch["observation"])
        trainer.record(metrics, updates=len(metrics))
    return trainer.summary


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/ppo.py", doc=__doc__)
