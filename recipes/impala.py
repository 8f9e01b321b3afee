"""IMPALA: importance-weighted actor-learner (Espeholt et al. 2018, arXiv:1802.01561) with V-trace, on TorchRL.

Actors collect ``[B, T]`` unrolls with a copy of the policy that may lag the learner's; the learner corrects for the
lag with V-trace (``tdrl.objectives.advantage.VTrace`` on TorchRL's ``vtrace_advantage_estimate``: truncated
importance weights ``rho_bar``, ``c_bar``) and takes one gradient step per batch on TorchRL's ``A2CLoss`` terms:
``-rho_s log pi(a_s|x_s) (r_s + gamma v_{s+1} - V(x_s)) + value_loss_coeff * 0.5 * (V(x_s) - v_s)^2 - entropy_coeff
* H``. Time-limit truncation keeps bootstrapping, termination stops it. ``trainer.kind=sync`` collects with the
learner's own weights (no lag: V-trace is the n-step return bootstrapped with ``V(x_T)``). The paper's settings
where they fit CartPole: ``rho_bar = c_bar = 1``, RMSProp (decay 0.99) with linear decay to 0, entropy cost 0.01,
baseline cost 0.5, gradient clip 40; unrolls of 10 steps at a learning rate of 1e-3. Defaults solve CartPole-v1
(eval return 475) within 60k frames (10 of 10 seeds, median 15k).

    python recipes/impala.py                                      # CartPole-v1
    python recipes/impala.py collector.kind=parallel collector.n_workers=2
    python recipes/impala.py trainer.kind=ray                     # 4 collector actors on Ray, one learner
    python recipes/impala.py env.id=Pendulum-v1                   # continuous actions (tanh-Gaussian)
    python recipes/impala.py --help                               # every key

Atari (``pip install 'tdrl[atari]'``; the CNN actor-critic, as ``recipes/ppo.py``'s), with the paper's Atari
settings (32 unrolls of 20 steps, RMSprop lr 6e-4 and epsilon 0.01, rewards clipped; the rest are the defaults)::

    python recipes/impala.py env.id=PongNoFrameskip-v4 env.episodic_lives=true loss.clip_reward=true \
        collector.batch_B=32 collector.batch_T=20 collector.total_frames=10000000 optim.lr=6e-4 optim.eps=0.01 \
        eval.max_steps=27000 logger.log_interval_steps=100000
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tdrl.config import (
    A2COptimConfig,
    ActorCriticModelConfig,
    AtariEnvConfig,
    CollectorConfig,
    ImpalaTrainerConfig,
    LoggerConfig,
    NonNegativeFloat,
    PolicyGradientLossConfig,
    PositiveFloat,
    RecipeConfig,
    run_recipe,
)


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class LossConfig(PolicyGradientLossConfig):
    """V-trace and the actor-critic objective with the paper's weights: value loss 0.5, entropy 0.01 (Atari)."""

    value_loss_coeff: NonNegativeFloat = 0.5
    entropy_coeff: NonNegativeFloat = 0.01
    rho_bar: PositiveFloat = 1.0
    """Clip of the importance weight in V-trace's TD errors and the policy gradient (the paper's 1.0)."""
    c_bar: PositiveFloat = 1.0
    """Clip of V-trace's trace-cutting weights (the paper's 1.0; it assumes c_bar <= rho_bar)."""


@dataclass
class OptimConfig(A2COptimConfig):
    lr: PositiveFloat = 1e-3
    linear_decay: bool = True
    """Decay the learning rate linearly to 0 over collector.total_frames (the paper's schedule)."""
    max_grad_norm: PositiveFloat = 40.0
    """Gradient norm clip (the paper's 40)."""


@dataclass
class Config(RecipeConfig):
    env: AtariEnvConfig = field(default_factory=AtariEnvConfig)
    collector: CollectorConfig = field(default_factory=lambda: CollectorConfig(batch_B=8, batch_T=10,
                                                                               total_frames=500_000))
    """Training collector and budget: 8 unrolls of 10 steps per update (the paper: 32 of 20)."""
    model: ActorCriticModelConfig = field(default_factory=ActorCriticModelConfig)
    """Actor-critic networks."""
    loss: LossConfig = field(default_factory=LossConfig)
    """V-trace targets and the actor-critic objective."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and its schedule."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval_steps=10_000))
    trainer: ImpalaTrainerConfig = field(default_factory=ImpalaTrainerConfig)
    """sync: collect with the learner's weights, then update, in one process; ray: trainer.n_actors collector
    actors anywhere in a Ray cluster send version-tagged unrolls (trainer.unrolls_per_batch per update)."""


def main(cfg: Config) -> dict:
    # torch, TorchRL and the envs load here, after the config is checked (a bad key fails in < 1 s)
    import torch
    from torchrl.modules import set_recurrent_mode

    from tdrl.log.run import Run
    from tdrl.models import actor_critic_from
    from tdrl.objectives.advantage import VTrace
    from tdrl.objectives.graphs import update_step
    from tdrl.objectives.policy_gradient import make_a2c_loss
    from tdrl.objectives.schedules import LinearSchedule
    from tdrl.objectives.update import Updater, a2c_optimizer
    from tdrl.wiring import check_trainer, collector_factory_from, eval_collector_from, make_trainer, prepare_recipe

    check_trainer(cfg.trainer, on_policy=True, device=cfg.run.device)  # before any process starts
    # --- Build ----------------------------------------------------------------------------------------------
    device, env_factory = prepare_recipe(cfg)  # starts workers early, seeds, resolves the device
    specs = env_factory.specs()  # checks the action space against model.distribution before any collector starts
    ac = actor_critic_from(specs, cfg.model).to(device)  # feed-forward, or recurrent with model.lstm

    # V-trace targets and advantages on TorchRL's kernel, scoring the actions the behaviour policy took
    vtrace = VTrace(ac.actor, ac.critic, gamma=cfg.loss.gamma, rho_bar=cfg.loss.rho_bar, c_bar=cfg.loss.c_bar)
    # TorchRL's A2CLoss: -log pi * advantage (V-trace's, rho-weighted), squared value error, entropy bonus
    loss = make_a2c_loss(ac, entropy_coeff=cfg.loss.entropy_coeff, critic_coeff=0.5 * cfg.loss.value_loss_coeff)
    updater = Updater(a2c_optimizer(loss.parameters(), cfg.optim), max_grad_norm=cfg.optim.max_grad_norm)

    run = Run.open(cfg, name="impala")
    # picklable: the trainer builds the collector (sync: here; a distributed trainer: one per actor)
    collector_factory = collector_factory_from(cfg, env_factory, ac.actor)
    # each evaluation: n_envs whole greedy episodes on their own envs
    eval_collector = eval_collector_from(cfg, ac.greedy)
    trainer = make_trainer(cfg, on_policy=True, collector_factory=collector_factory, policy=ac.actor,
                           eval_collector=eval_collector, run=run, checkpoint_state={"model": ac, "updater": updater})
    lr_at = LinearSchedule(cfg.optim.lr, 0.0 if cfg.optim.linear_decay else cfg.optim.lr,
                           duration=cfg.collector.total_frames)

    # --- Update ---------------------------------------------------------------------------------------------
    compute_loss = torch.compile(loss) if cfg.optim.compile else loss

    def learn(batch):  # the device half of an update (RMSprop has no fused step: it reads the skip flag)
        with set_recurrent_mode(ac.recurrent):  # LSTM: whole [B, T] sequences from the stored initial state
            metrics = updater.apply(compute_loss(batch if ac.recurrent else batch.reshape(-1)))
        metrics["rho"] = batch["rho"].mean()  # < 1: the policy moved since these unrolls were collected
        return metrics

    learn = update_step(learn, cudagraphs=False, device=device)

    def policy_lag(batch):
        """Learner version minus each frame's behaviour-policy version: mean and max (unrolls tagged by their
        actor; the sync trainer's carry no tag, and lag 0)."""
        tags = batch.get(("collector", "policy_version"), None)
        if tags is None:
            return {}
        lag = (getattr(trainer, "policy_version", updater.updates) - tags).float()
        return {"policy_lag": lag.mean(), "policy_lag_max": lag.max()}

    def update(batch):
        if cfg.loss.clip_reward:  # Atari: each step's reward to [-1, 1] (TrajInfos keep the game score)
            batch["next", "reward"] = batch["next", "reward"].clamp(-1, 1)
        vtrace(batch)  # writes state_value, advantage, value_target and rho (time limits bootstrap, terminations not)
        metrics = learn(batch)
        updater.advance()
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    for batch in trainer:  # [B, T] unrolls (a distributed trainer: several actors' unrolls, tagged by version)
        batch = batch.to(device)
        updater.lr = lr_at(trainer.frames)
        lag = policy_lag(batch)
        metrics = update(batch)
        metrics.update(lag)
        if ac.obs_norm is not None:  # after the update, so this batch was collected and trained with one normaliser
            ac.obs_norm.update(batch["observation"])
        trainer.record(metrics, updates=1)
    return trainer.summary


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/impala.py", doc=__doc__)
