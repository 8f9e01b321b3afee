"""QMIX, VDN and independent Q-learning: value decomposition for cooperative agents (Rashid et al. 2018,
arXiv:1803.11485; Sunehag et al. 2018, arXiv:1706.05296; Tan 1993) on TorchRL's ``QMixerLoss``/``DQNLoss`` through
``tdrl.objectives.value_decomposition``.

All agents of the env form one group (``(agents, "observation")`` ``[B, T, n_agents, obs]``...,
``tdrl.envs.multiagent``'s ``group_map=one_group``; they must share their spaces) and share one Q-network (an MLP
per agent, ``model.share_params``). Each step every agent acts epsilon-greedily on its own Q-values (random actions
drawn from those its ``(agents, "action_mask")`` allows, where the env has one), the grouped transitions go into a
replay, and each update regresses, on a sampled batch of them:

- ``loss.method=qmix``: ``Q_tot = mix(Q_1(a_1), ..., Q_n(a_n); state)``, monotonic in each ``Q_i``, towards
  ``r + gamma * mix_target(max_a Q_target_i(a); state')``; ``vdn``: the mix is the sum; ``iql``: each agent's own
  ``Q_i`` towards its own reward's target. The target networks are copies, refreshed every
  ``optim.target_update_interval`` updates.

Rewards: QMIX and VDN learn the team reward, which ``GroupedEnv`` puts at the root as the **sum over agents** (mpe2's
simple_spread, ``local_ratio=0.5``: each agent gets half the shared landmark-distance reward plus half its own
collision penalties, so the sum is 1.5 times the shared reward plus half of all collisions); IQL learns each agent's
own reward. Returns in the logs are that sum (EPyMARL divides MPE returns by the number of agents).

    python recipes/qmix.py                                     # QMIX on mpe2/simple_spread_v3, 3 agents
    python recipes/qmix.py loss.method=vdn                     # or loss.method=iql
    python recipes/qmix.py collector.kind=parallel collector.n_workers=2
    python recipes/qmix.py --help

Defaults: PyMARL's QMIX (Samvelyan et al. 2019, github.com/oxwhirl/pymarl, src/config/default.yaml and
algs/qmix.yaml; EPyMARL keeps them): lr 5e-4, gamma 0.99, gradient norm clip 10, a batch of 32 episodes (here 32 x
25 = 800 transitions), one update per episode collected (replay ratio 800 / 25 = 32), learning from 32 episodes on,
a replay of 5,000 episodes (125,000 transitions), target networks copied every 200 updates, epsilon 1 -> 0.05 over
50k env steps and greedy evaluation; from EPyMARL, rewards standardised (``loss.standardise_rewards``). Not
PyMARL's: an MLP agent, not a GRU (simple_spread's observations hold what an agent needs), no agent id in the
observation, TorchRL's one-layer hypernetworks (PyMARL: two of 64), Adam (as EPyMARL; PyMARL used RMSprop), the
double-Q target off (``loss.double_q``), and transitions, not whole episodes, in the replay.

Measured (one 2-core machine, seed 0; eval return summed over the 3 agents, -109 at start): VDN -54 at 50k frames,
-53 at 100k and 150k (MAPPO's recipe: about -60). QMIX is not stable here: -67 at 50k, then its loss and gradient
norm grow without bound and the return falls to -184 by 200k frames (-200 without reward standardisation, from
100k; -207 with ``loss.double_q=true``, whose loss grows as fast: 1.4 at 50k, 76 at 200k, 580 at 300k).
PyMARL's two-layer hypernetworks (64 wide, tried in place of TorchRL's) did not hold it either: -203 at 150k,
loss 1,424 at 300k. BenchMARL's QMIX, on the same TorchRL mixer, fails too (docs/multiagent.md#simple-spread).

Needs ``pip install 'tdrl[marl]'``. Not yet: several groups mixed together (adversaries), recurrent agents,
``trainer.kind=async``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tdrl.config import (
    CollectorConfig,
    ConfigError,
    Count,
    Fraction,
    GroupedEnvConfig,
    LayerSizes,
    LoggerConfig,
    NonNegativeInt,
    OffPolicyLossConfig,
    OffPolicyOptimConfig,
    OffPolicyTrainerConfig,
    PositiveFloat,
    PositiveFraction,
    RecipeConfig,
    ReplayConfig,
    check_devices,
    run_recipe,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tensordict import TensorDictBase
    from tensordict.utils import NestedKey


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class MultiAgentEnvConfig(GroupedEnvConfig):
    id: str = "mpe2/simple_spread_v3"
    """A multi-agent env id (mpe2/..., pettingzoo/..., lbforaging/...); simple_spread: 3 agents, 25-step episodes,
    its per-agent rewards summed at the root (module docstring)."""


@dataclass
class ModelConfig:
    hidden_sizes: LayerSizes = field(default_factory=lambda: [64, 64])
    """Hidden layers of each agent's Q-network MLP (PyMARL's agent: 64 wide)."""
    share_params: bool = True
    """The agents share one Q-network (PyMARL)."""
    mixing_embed_dim: Count = 32
    """QMIX's mixing-network width (PyMARL mixing_embed_dim)."""


@dataclass
class LossConfig(OffPolicyLossConfig):
    method: Literal["qmix", "vdn", "iql"] = "qmix"
    """qmix: a monotonic mix conditioned on the state; vdn: the sum of the agents' Q-values; iql: each agent alone."""
    gamma: PositiveFraction = 0.99
    """Discount per env step (PyMARL)."""
    standardise_rewards: bool = True
    """Train on rewards standardised by their running mean and std over the sampled batches (EPyMARL's
    standardise_rewards, its MPE setting). Without it simple_spread's large negative returns saturate QMIX's ELU
    mixer and the run diverged once epsilon was low (seed 0: eval return -64 at 50k frames, -200 from 100k on); with
    it QMIX still diverges there, later (module docstring)."""

    double_q: bool = False
    """Targets value each agent's next action chosen by the online network, not the target network's own max
    (PyMARL's double_q; van Hasselt et al. 2016)."""

    def validate(self) -> None:
        if self.method == "iql" and self.n_step > 1:
            raise ConfigError(f"loss.n_step={self.n_step} with loss.method=iql: the replay sums n-step returns of the "
                              "team reward, IQL learns each agent's own; use loss.n_step=1")


@dataclass
class ExplorationConfig:
    """Each agent's epsilon-greedy exploration (PyMARL's epsilon_greedy action selector)."""

    eps_init: Fraction = 1.0
    """Epsilon at the start (PyMARL epsilon_start)."""
    eps_final: Fraction = 0.05
    """Epsilon after eps_steps env frames (PyMARL epsilon_finish)."""
    eps_steps: NonNegativeInt = 50_000
    """Env frames over which epsilon falls linearly from frame 0 (PyMARL epsilon_anneal_time)."""
    eps_eval: Fraction = 0.0
    """Epsilon of evaluation episodes (PyMARL's test episodes are greedy)."""


@dataclass
class OptimConfig(OffPolicyOptimConfig):
    lr: PositiveFloat = 5e-4
    """Adam learning rate (PyMARL lr)."""
    batch_size: Count = 800
    """Transitions per update: PyMARL's 32 episodes of simple_spread's 25 steps."""
    replay_ratio: PositiveFloat = 32.0
    """Transitions sampled per transition collected: 32 = one update of 800 per 25-step episode (PyMARL)."""
    min_steps_learn: Count = 800
    """Env frames before the first update: PyMARL learns once its replay holds a batch (32 episodes)."""
    target_update_interval: Count = 200
    """Updates between target-network copies (PyMARL target_update_interval: 200 episodes, one update each)."""
    target_update_tau: PositiveFraction = 1.0
    """Polyak factor of the target update; 1.0 copies (PyMARL)."""
    max_grad_norm: PositiveFloat | None = 10.0
    """Gradient norm clip (PyMARL grad_norm_clip)."""


@dataclass
class Config(RecipeConfig):
    """Rewards: QMIX and VDN learn the team reward, the sum over agents that ``GroupedEnv`` puts at the root
    (simple_spread: not EPyMARL's per-agent mean); IQL learns each agent's own, ``("next", "agents", "reward")``."""

    env: MultiAgentEnvConfig = field(default_factory=MultiAgentEnvConfig)
    collector: CollectorConfig = field(default_factory=lambda: CollectorConfig(batch_B=4, batch_T=25,
                                                                               total_frames=2_000_000))
    """Training collector and budget (frames count env steps, each of all agents; 2M: EPyMARL's MPE budget)."""
    replay: ReplayConfig = field(default_factory=lambda: ReplayConfig(size=125_000))
    """Replay of grouped transitions (125,000: PyMARL's 5,000 episodes of 25 steps)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval_steps=50_000))
    """Log rows and evaluations every 50k frames (EPyMARL's test_interval)."""
    trainer: OffPolicyTrainerConfig = field(default_factory=OffPolicyTrainerConfig)
    """sync only (async is not wired up here yet)."""

    def validate(self) -> None:
        check_devices(self)


GROUP = "agents"  # group_map=one_group: every agent in this one group


# --- Rewards --------------------------------------------------------------------------------------------------
class RewardStandardizer:
    """EPyMARL's reward standardisation: each sampled batch updates a running mean and variance of its rewards
    (Chan et al.'s parallel update, all on the rewards' device) and then has them standardised, in place. The
    statistics are tensors in ``state_dict()``, so a resumed run continues them."""

    def __init__(self, key: NestedKey, device: Any) -> None:
        import torch

        self.key = key
        self.stats = {"mean": torch.zeros((), device=device), "var": torch.ones((), device=device),
                      "count": torch.full((), 1e-4, device=device)}

    def __call__(self, sample: TensorDictBase) -> TensorDictBase:
        reward = sample.get(self.key)
        mean, var, count = self.stats["mean"], self.stats["var"], self.stats["count"]
        n = reward.numel()
        delta, total = reward.mean() - mean, count + n
        var.copy_((var * count + reward.var(correction=0) * n + delta.square() * count * n / total) / total)
        mean.add_(delta * n / total)
        count.add_(n)
        return sample.set(self.key, (reward - mean) / var.sqrt())

    def state_dict(self) -> dict[str, Any]:
        return {k: v.clone() for k, v in self.stats.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in self.stats.items():
            v.copy_(state[k])


# --- Recipe ---------------------------------------------------------------------------------------------------
def main(cfg: Config, env_factory: Callable[[], Any] | None = None) -> dict:
    """Train ``cfg``; ``env_factory`` (a picklable callable building a ``GroupedEnv`` with one group ``agents``)
    stands in for ``env.id`` where no id names the env (tests: a matrix game); evaluation then needs
    ``eval.n_envs=0``."""
    import torch

    from tdrl.envs import EnvFactory, EnvSpecs
    from tdrl.log.run import Run
    from tdrl.models import EpsilonGreedy, chain_policy
    from tdrl.objectives.graphs import graph_adam, update_step
    from tdrl.objectives.update import TargetUpdate, Updater
    from tdrl.objectives.value_decomposition import make_group_q, make_value_decomposition_loss
    from tdrl.replay import grouped_transition_keys
    from tdrl.wiring import (
        check_min_steps_learn,
        check_trainer,
        collector_factory_from,
        make_trainer,
        prepare_recipe,
        transition_replay_from,
    )

    check_trainer(cfg.trainer, on_policy=False, supported=("sync",))
    # --- Build ----------------------------------------------------------------------------------------------
    device, _ = prepare_recipe(cfg)
    check_min_steps_learn(cfg.optim.min_steps_learn, n_step=cfg.loss.n_step, batch_B=cfg.collector.batch_B)
    env_kwargs = {**cfg.env.kwargs(), "group_map": "one_group"}
    if env_factory is None:
        env_factory = EnvFactory(cfg.env.id, env_kwargs)
        specs = env_factory.specs()  # an unknown id, a missing extra or agents with other spaces: one line, exit 2
    else:
        specs = EnvSpecs.from_env(env_factory())
    obs_spec, action_spec = specs.observation_spec, specs.action_spec[GROUP, "action"]
    n_agents, obs_dim = obs_spec[GROUP, "observation"].shape
    masked, has_state = "action_mask" in obs_spec[GROUP].keys(), "state" in obs_spec.keys()
    if getattr(env_factory(), "turn_based", False):  # the targets would skip the opponent's turn (a loss lands there)
        raise ConfigError(f"env.id={cfg.env.id!r} is turn-based: one agent moves per step, and value decomposition "
                          "learns joint moves; use recipes/mappo.py")
    if not hasattr(action_spec, "nvec"):
        raise ConfigError(f"env.id={cfg.env.id!r} has continuous actions; value decomposition needs discrete ones "
                          "(use recipes/mappo.py)")
    if cfg.loss.method == "qmix" and not has_state:
        raise ConfigError(f"loss.method=qmix mixes on the env's global state, and env.id={cfg.env.id!r} has none; "
                          "use loss.method=vdn")
    n_actions = int(action_spec.nvec[0])

    # Q_i(o_i, .) for every agent, the greedy joint action agent by agent, then each agent's epsilon-greedy draw
    q = make_group_q(n_agents, obs_dim, n_actions, group=GROUP, share_params=cfg.model.share_params,
                     num_cells=cfg.model.hidden_sizes, action_mask=masked)
    exploration = EpsilonGreedy(n_actions, eps_init=cfg.exploration.eps_init, eps_final=cfg.exploration.eps_final,
                                end_frames=cfg.exploration.eps_steps, eps_eval=cfg.exploration.eps_eval,
                                action_key=(GROUP, "action"),
                                action_mask_key=(GROUP, "action_mask") if masked else None)
    policy = chain_policy(q, exploration).to(device)  # evaluation: the same policy with eps_eval
    # the TD loss of Q_tot (qmix, vdn) or of each Q_i (iql), against target networks
    state_shape = tuple(obs_spec["state"].shape) if has_state else None
    loss = make_value_decomposition_loss(cfg.loss.method, q, n_agents=n_agents, group=GROUP, state_shape=state_shape,
                                         mixing_embed_dim=cfg.model.mixing_embed_dim, double_q=cfg.loss.double_q)
    loss = loss.to(device)
    loss.make_value_estimator(gamma=cfg.loss.gamma)
    target_update = TargetUpdate(loss, interval=cfg.optim.target_update_interval, tau=cfg.optim.target_update_tau)
    updater = Updater(graph_adam(loss.parameters(), lr=cfg.optim.lr, device=device, cudagraphs=cfg.optim.cudagraphs),
                      max_grad_norm=cfg.optim.max_grad_norm, target_update=target_update)

    # the team's reward (qmix, vdn) or each agent's (iql), standardised over the batches sampled so far
    reward_key = ("next", GROUP, "reward") if cfg.loss.method == "iql" else ("next", "reward")
    standardise = RewardStandardizer(reward_key, device) if cfg.loss.standardise_rewards else None

    run = Run.open(cfg, name=cfg.loss.method)
    # the grouped transitions, [n, n_agents] per sampled step (observations, presence and action masks, actions,
    # the agents' own rewards and flags for IQL, the global state for QMIX); n-step returns of the team reward
    replay = transition_replay_from(cfg, run.dir, device, keys=grouped_transition_keys(obs_spec))
    collector = collector_factory_from(cfg, env_factory, policy, device=device, return_same_td=True)()
    eval_collector = None if cfg.eval.n_envs == 0 else make_eval(cfg, policy, env_kwargs)
    trainer = make_trainer(cfg, on_policy=False, collector=collector, replay=replay, eval_collector=eval_collector,
                           run=run, checkpoint_state={"model": loss, "updater": updater, "replay": replay,
                                                      "exploration": exploration,
                                                      **({"rewards": standardise} if standardise is not None else {})})

    # --- Update ---------------------------------------------------------------------------------------------
    compute_loss = torch.compile(loss) if cfg.optim.compile else loss

    def learn(sample: TensorDictBase) -> TensorDictBase:
        if standardise is not None:
            sample = standardise(sample)
        return updater.apply(compute_loss(sample).rename_key_("loss", "loss_q"))  # logged as loss/q

    learn_step = update_step(learn, cudagraphs=cfg.optim.cudagraphs, device=device)  # optim.cudagraphs: one graph

    def update() -> TensorDictBase:
        metrics = learn_step(replay.sample(cfg.optim.batch_size))  # a batch of grouped transitions
        updater.advance()  # counters and, every target_update_interval updates, the target networks
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    for _ in trainer:  # each iteration: batch_B x batch_T new grouped transitions went into the replay
        exploration.set_frames(trainer.frames)  # epsilon of the next batch
        metrics = [update() for _ in range(trainer.updates_due)]
        trainer.record(metrics, updates=len(metrics))
    return trainer.summary


def make_eval(cfg: Config, policy: Any, env_kwargs: dict) -> Any:
    """``eval.n_envs`` greedy episodes (epsilon ``exploration.eps_eval``) on envs of their own."""
    from tdrl.collect import make_eval_collector

    return make_eval_collector(cfg.env.id, policy, n_envs=cfg.eval.n_envs, max_steps=cfg.eval.max_steps,
                               seed=cfg.run.seed + 10_000, discount=cfg.loss.gamma, video=cfg.eval.video,
                               env_kwargs=env_kwargs)


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/qmix.py", doc=__doc__)
