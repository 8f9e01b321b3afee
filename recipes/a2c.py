"""A2C: synchronous advantage actor-critic (Mnih et al. 2016, arXiv:1602.01783), rlpyt's semantics on TorchRL.

One gradient step per collector batch on ``-log pi(a|s) * A + value_loss_coeff * 0.5 * (V - R)^2 - entropy_coeff * H``,
advantages from GAE (``gae_lambda=1``, the default, is the discounted return bootstrapped with ``V(s_T)``; time-limit
truncation keeps bootstrapping, termination stops it). Feed-forward or LSTM policies (the LSTM replays each env's
``[T]`` sequence from the state stored at its first step). Defaults solve CartPole-v1 (eval return 500) within 500k
frames.

    python recipes/a2c.py                                     # CartPole-v1
    python recipes/a2c.py collector.kind=parallel collector.n_workers=2 model.lstm=true
    python recipes/a2c.py --help                              # every key

Atari (``pip install 'tdrl[atari]'``; the CNN actor-critic, as ``recipes/ppo.py``'s), with baselines' A2C Atari
settings (16 envs x 5 steps, RMSprop lr 7e-4 decayed linearly, entropy 0.01, value loss 0.5 on ``(V - R)^2``: the
default ``loss.value_loss_coeff=1``, grad norm 0.5)::

    python recipes/a2c.py env.id=PongNoFrameskip-v4 env.episodic_lives=true loss.clip_reward=true \
        collector.batch_B=16 collector.total_frames=10000000 loss.entropy_coeff=0.01 optim.linear_decay=true \
        eval.max_steps=27000 logger.log_interval_steps=100000
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tdrl.config import (
    A2COptimConfig,
    ActorCriticModelConfig,
    AtariEnvConfig,
    CollectorConfig,
    Fraction,
    LoggerConfig,
    PolicyGradientLossConfig,
    PositiveFloat,
    RecipeConfig,
    run_recipe,
)


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class LossConfig(PolicyGradientLossConfig):
    """A2C's objective; rlpyt's A2C weighs the value loss 0.5 and the entropy 0.01."""

    gae_lambda: Fraction = 1.0
    """GAE lambda; 1.0 = discounted return bootstrapped with V(s_T) (rlpyt's default)."""
    normalize_advantage: bool = False
    """Normalise advantages over the batch."""


@dataclass
class OptimConfig(A2COptimConfig):
    lr: PositiveFloat = 7e-4


@dataclass
class Config(RecipeConfig):
    env: AtariEnvConfig = field(default_factory=AtariEnvConfig)
    collector: CollectorConfig = field(default_factory=lambda: CollectorConfig(batch_T=5, total_frames=500_000))
    model: ActorCriticModelConfig = field(default_factory=ActorCriticModelConfig)
    """Actor-critic networks."""
    loss: LossConfig = field(default_factory=LossConfig)
    """A2C objective."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and its schedule."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval_steps=10_000))


def main(cfg: Config) -> dict:
    # torch, TorchRL and the envs load here, after the config is checked (a bad key fails in < 1 s)
    import torch
    from torchrl.modules import set_recurrent_mode

    from tdrl.log.run import Run
    from tdrl.models import actor_critic_from
    from tdrl.objectives.advantage import GAE
    from tdrl.objectives.graphs import update_step
    from tdrl.objectives.policy_gradient import make_a2c_loss
    from tdrl.objectives.schedules import LinearSchedule
    from tdrl.objectives.update import Updater, a2c_optimizer
    from tdrl.wiring import collector_factory_from, eval_collector_from, make_trainer, prepare_recipe

    # --- Build ----------------------------------------------------------------------------------------------
    device, env_factory = prepare_recipe(cfg)  # starts workers early, seeds, resolves the device
    specs = env_factory.specs()  # checks the action space against model.distribution before any collector starts
    ac = actor_critic_from(specs, cfg.model).to(device)  # feed-forward, or recurrent with model.lstm

    advantage = GAE(ac.critic, gamma=cfg.loss.gamma, lmbda=cfg.loss.gae_lambda)  # TorchRL's GAE, one critic call
    # TorchRL's A2CLoss (squared value error)
    loss = make_a2c_loss(ac, entropy_coeff=cfg.loss.entropy_coeff, critic_coeff=0.5 * cfg.loss.value_loss_coeff)
    updater = Updater(a2c_optimizer(loss.parameters(), cfg.optim), max_grad_norm=cfg.optim.max_grad_norm)

    run = Run.open(cfg, name="a2c")
    collector = collector_factory_from(cfg, env_factory, ac.actor, device=device)()
    # each evaluation: n_envs whole greedy episodes on their own envs
    eval_collector = eval_collector_from(cfg, ac.greedy)
    trainer = make_trainer(cfg, on_policy=True, collector=collector, eval_collector=eval_collector, run=run,
                           checkpoint_state={"model": ac, "updater": updater})
    lr_at = LinearSchedule(cfg.optim.lr, 0.0 if cfg.optim.linear_decay else cfg.optim.lr, duration=trainer.n_itr)

    # --- Update ---------------------------------------------------------------------------------------------
    compute_loss = torch.compile(loss) if cfg.optim.compile else loss

    def learn(batch):  # the device half of an update (RMSprop has no fused step: it reads the skip flag)
        with set_recurrent_mode(ac.recurrent):  # LSTM: whole [B, T] sequences from the stored initial state
            return updater.apply(compute_loss(batch if ac.recurrent else batch.reshape(-1)))

    learn = update_step(learn, cudagraphs=False, device=device)

    def update(batch):
        if cfg.loss.clip_reward:  # Atari: each step's reward to [-1, 1] (TrajInfos keep the game score)
            batch["next", "reward"] = batch["next", "reward"].clamp(-1, 1)
        advantage(batch)  # writes state_value, advantage and value_target (time limits bootstrap, terminations not)
        if cfg.loss.normalize_advantage:
            adv = batch["advantage"]
            batch["advantage"] = (adv - adv.mean()) / (adv.std() + 1e-8)
        metrics = learn(batch)
        updater.advance()
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    for batch in trainer:
        updater.lr = lr_at(trainer.itr)
        metrics = update(batch)
        if ac.obs_norm is not None:  # after the update, so this batch was collected and trained with one normaliser
            ac.obs_norm.update(batch["observation"])
        trainer.record(metrics, updates=1)
    return trainer.summary


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/a2c.py", doc=__doc__)
