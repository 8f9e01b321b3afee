"""Recipe wiring: a recipe's parts built from its config, the same way in every recipe. :func:`prepare_recipe`
(and :func:`prepare_off_policy`) first; the collector, evaluator and replay (:func:`collector_factory_from`,
:func:`eval_collector_from`, :func:`transition_replay_from`); then the trainer ``trainer.kind=sync|ddp|async|ray``
names (:func:`make_trainer`), one loop body for all of them.

A recipe's ``trainer`` section names the kinds it wires up (``OnPolicyTrainerConfig``, ``OffPolicyTrainerConfig``,
``ApeXTrainerConfig``, ``ImpalaTrainerConfig`` of :mod:`tdrl.config`: each has only its kinds' keys, so ``--help``
lists nothing the recipe refuses). It calls :func:`check_trainer` first thing in ``main``; under
``trainer.kind=ddp`` without a process group it returns ``launch_data_parallel(main, cfg, ...)`` (each rank runs
``main`` again); then it builds its trainer with :func:`make_trainer`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import torch
from torch import nn

from tdrl.config import ConfigError, TrainerConfig, trainer_kinds
from tdrl.distributed.data_parallel import DataParallelTrainer
from tdrl.distributed.ddp_launch import check_data_parallel
from tdrl.distributed.ray_connect import check_reachable, ray_target
from tdrl.distributed.ray_trainer import ActorHooks, RayTrainer
from tdrl.train.async_ import AsyncTrainer
from tdrl.train.schedule import Schedule
from tdrl.train.sync import SyncTrainer
from tdrl.utils.distributed import is_distributed, resolve_device
from tdrl.utils.seeding import seed_everything

__all__ = ["TRAINER_KINDS", "Trainer", "TrainerConfig", "check_min_steps_learn", "check_trainer",
           "collector_factory_from", "eval_collector_from", "make_trainer", "prepare_off_policy", "prepare_recipe",
           "transition_replay_from"]

TRAINER_KINDS = ("sync", "ddp", "async", "ray")

Trainer = SyncTrainer | AsyncTrainer | RayTrainer
"""What :func:`make_trainer` returns (a :class:`DataParallelTrainer` is a :class:`SyncTrainer`): each iterates
the loop, has ``updates_due``, ``record()``, the counters and ``summary``."""


def check_min_steps_learn(min_steps_learn: int, *, n_step: int, batch_B: int) -> None:
    """Raise ``ConfigError`` for an off-policy learning start at which the first update would find no complete
    transition: the replay draws with replacement, so a batch may be larger than what it holds (SB3's
    ``learning_starts=100`` with batch 256), but an n-step transition is complete only ``n_step - 1`` steps after
    it starts, in every env."""
    needed = 1 + (n_step - 1) * batch_B
    if min_steps_learn < needed:
        raise ConfigError(f"optim.min_steps_learn={min_steps_learn} is below the {needed} frames the first complete "
                          f"{n_step}-step transition needs with {batch_B} env(s): the first update would find an "
                          "empty replay")


def check_trainer(cfg: Any, *, on_policy: bool, device: str = "cpu", supported: Sequence[str] | None = None) -> None:
    """Reject trainer settings that cannot work, before any process starts (call it first thing in ``main``).

    ``cfg``: a trainer section of :mod:`tdrl.config`; ``on_policy``: the algorithm learns only from fresh batches
    (no async then); ``device``: the learner device (``trainer.backend=nccl`` needs CUDA); ``supported``: the kinds
    this recipe wires up, by default those its section names (``ray`` only in a section that names it: an
    on-policy recipe must correct for the actors' lag, as IMPALA's V-trace does). Raises ``ConfigError`` for an
    unknown or unsupported ``trainer.kind``, async with an on-policy algorithm or a malformed Ray address
    (naming ``trainer.ray_address`` or ``RAY_ADDRESS``, where it came from), and ``DistributedSetupError`` for a
    world size or backend this machine cannot run.
    """
    supported = trainer_kinds(cfg) if supported is None else supported
    if cfg.kind not in TRAINER_KINDS:
        raise ConfigError(f"trainer.kind={cfg.kind!r}; choose one of {', '.join(TRAINER_KINDS)}")
    if cfg.kind not in supported:
        raise ConfigError(f"trainer.kind={cfg.kind} is not wired up in this recipe; it supports "
                         f"{', '.join(supported)}")
    if cfg.kind == "async" and on_policy:
        raise ConfigError("trainer.kind=async needs an off-policy algorithm (the collector process fills a replay the "
                         "optimizer samples from, rlpyt's AsyncRl); this recipe is on-policy: use trainer.kind=sync "
                         "or trainer.kind=ddp")
    if cfg.kind == "ddp":
        check_data_parallel(cfg.world_size, cfg.backend, device)
    if cfg.kind == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("trainer.kind=ray needs Ray: pip install 'tdrl[distributed]'")
    if cfg.kind == "ray" and (target := ray_target(cfg.ray_address)):
        check_reachable(*target)  # before anything is built: ray.init would retry for minutes


@overload  # on-policy: never async, so each iteration yields a batch (a TensorDict), not an iteration count
def make_trainer(cfg: Any, *, on_policy: Literal[True], collector: Any = ...,
                 collector_factory: Callable[[], Any] | None = ..., modules: Sequence[nn.Module] = ...,
                 replay: Any = ..., policy: nn.Module | None = ..., actor_hooks: ActorHooks | None = ...,
                 schedule: Schedule | None = ..., **kwargs: Any) -> SyncTrainer | RayTrainer: ...
@overload
def make_trainer(cfg: Any, *, on_policy: bool, collector: Any = ...,
                 collector_factory: Callable[[], Any] | None = ..., modules: Sequence[nn.Module] = ...,
                 replay: Any = ..., policy: nn.Module | None = ..., actor_hooks: ActorHooks | None = ...,
                 schedule: Schedule | None = ..., **kwargs: Any) -> Trainer: ...
def make_trainer(
    cfg: Any,
    *,
    on_policy: bool,
    collector: Any = None,
    collector_factory: Callable[[], Any] | None = None,
    modules: Sequence[nn.Module] = (),
    replay: Any = None,
    policy: nn.Module | None = None,
    actor_hooks: ActorHooks | None = None,
    schedule: Schedule | None = None,
    **kwargs: Any,
) -> Trainer:
    """The trainer ``cfg.trainer.kind`` names (sync for a config without a ``trainer`` section), for a recipe's
    whole config ``cfg``.

    ``schedule``: by default :meth:`Schedule.from_config` (the budget, log, evaluation and checkpoint cadence,
    ``stop_return`` and, off-policy, the replay ratio, batch size and learning start); the seed is ``run.seed``.
    ``kwargs`` add the rest (``run``, ``eval_collector``, ``checkpoint_state``, ...). ``collector`` (sync, ddp) or
    ``collector_factory`` (picklable; async builds the collector in its process); ``modules``: what ddp averages
    the gradients of (the loss module); ``replay``: filled with every batch; ``policy``: whose weights the async
    collector (ray: the actors) receives; ``actor_hooks``: ray only (Ape-X). Raises ``ValueError`` (see
    :func:`check_trainer`) before any collector is built.
    """
    seed = kwargs.pop("seed", cfg.run.seed)
    schedule = schedule or Schedule.from_config(cfg, on_policy=on_policy)
    cfg = getattr(cfg, "trainer", None) or TrainerConfig(kind="sync")
    # every check comes before a collector (and its workers) is built; the recipe checked its own kinds first
    check_trainer(cfg, on_policy=on_policy, supported=TRAINER_KINDS)
    _check_parts(cfg, collector=collector, collector_factory=collector_factory, modules=modules, policy=policy)
    if cfg.kind in ("async", "ray"):
        assert collector_factory is not None and policy is not None  # _check_parts
        if collector is not None:
            collector.shutdown()
        setting = functools.partial(_setting, cfg)
        max_lag = None if setting("max_lag_frames") < 0 else setting("max_lag_frames")
        if cfg.kind == "async":
            return AsyncTrainer(collector_factory=collector_factory, replay=replay, policy=policy, schedule=schedule,
                                seed=seed, updates_per_sync=cfg.updates_per_sync, max_lag_frames=max_lag, **kwargs)
        return RayTrainer(collector_factory=collector_factory, replay=replay, policy=policy, schedule=schedule,
                          seed=seed, ray=cfg, hooks=actor_hooks or ActorHooks(),
                          updates_per_sync=setting("updates_per_sync"), max_lag_frames=max_lag,
                          unrolls_per_batch=setting("unrolls_per_batch"), **kwargs)
    built = collector is None
    if built:
        assert collector_factory is not None  # checked with collector above
        collector = collector_factory()
    try:
        if cfg.kind == "ddp":
            return DataParallelTrainer(collector=collector, schedule=schedule, replay=replay, modules=modules,
                                       **kwargs)
        return SyncTrainer(collector=collector, schedule=schedule, replay=replay, **kwargs)
    except BaseException:
        if built:
            collector.shutdown()  # no worker processes outlive a bad argument
        raise


def _check_parts(cfg: Any, *, collector: Any, collector_factory: Any, modules: Sequence[nn.Module],
                 policy: nn.Module | None) -> None:
    """Raise ``ValueError`` when the parts given cannot make the trainer ``cfg.kind`` names."""
    if cfg.kind != "async" and collector is None and collector_factory is None:
        raise ValueError(f"trainer.kind={cfg.kind} needs the collector (or collector_factory)")
    if cfg.kind == "ddp":
        if not modules:
            raise ValueError("trainer.kind=ddp needs the replicated modules whose gradients it averages "
                             "(modules=[loss])")
        if not is_distributed() and cfg.world_size > 1:
            raise ValueError(f"trainer.kind=ddp with trainer.world_size={cfg.world_size}, but no process group: this "
                             "recipe must start its ranks with tdrl.distributed.launch_data_parallel before building "
                             "them")
    if cfg.kind in ("async", "ray") and (collector_factory is None or policy is None):
        raise ValueError(f"trainer.kind={cfg.kind} needs collector_factory (the collector is built in its own "
                         "process) and the policy whose weights it receives")


def _setting(section: Any, key: str) -> Any:
    """``section.<key>``, else the key's default: a recipe's section lacks the keys its algorithm ignores
    (Ape-X's has no ``unrolls_per_batch``, IMPALA's no ``updates_per_sync``)."""
    return getattr(section, key, getattr(TrainerConfig, key))


def collector_factory_from(cfg: Any, env_factory: Callable[..., Any], policy: nn.Module | None,
                      **kwargs: Any) -> Callable[[], Any]:
    """A picklable factory of the recipe's training collector: ``make_collector`` with ``cfg.collector``'s kind,
    ``batch_B``, ``batch_T`` and ``n_workers``, ``run.seed`` and the TrajInfo discount ``loss.gamma``; ``kwargs``
    add or override (``return_same_td=True`` where each batch goes straight into a replay, ``device``)."""
    from tdrl.collect import make_collector  # here: importing tdrl.wiring stays free of torchrl.envs

    c = cfg.collector
    return functools.partial(make_collector, c.kind, env_factory, policy, **{
        "batch_B": c.batch_B, "batch_T": c.batch_T, "n_workers": c.n_workers, "seed": cfg.run.seed,
        "discount": cfg.loss.gamma, **kwargs})


def eval_collector_from(cfg: Any, policy: nn.Module | None, *, observations_of: Any = None) -> Any:
    """The recipe's evaluator (``None`` with ``eval.n_envs=0``): ``eval.n_envs`` whole episodes of ``env.id`` on
    envs of their own, seeded apart from the training envs (``run.seed + 10_000``), discount ``loss.gamma``;
    ``observations_of``: the training collector whose observation transform evaluation applies too."""
    from tdrl.collect import make_eval_collector

    e = cfg.eval
    return make_eval_collector(cfg.env.id, policy, n_envs=e.n_envs, max_steps=e.max_steps,
                               seed=cfg.run.seed + 10_000, discount=cfg.loss.gamma, video=e.video,
                               observations_of=observations_of)


def transition_replay_from(cfg: Any, run_dir: Any, device: torch.device, **kwargs: Any) -> Any:
    """The off-policy recipe's :class:`tdrl.replay.TransitionReplayBuffer` in ``<run_dir>/replay``: ``replay.size``,
    ``loss.n_step`` returns discounted by ``loss.gamma``, seeded by ``run.seed``, gathering samples where
    ``replay.device`` says (:func:`tdrl.config.replay_copy`); ``kwargs`` add or override (``sampler``, ...)."""
    from tdrl.config import replay_copy
    from tdrl.replay import TRANSITION_KEYS, TransitionReplayBuffer

    return TransitionReplayBuffer(run_dir / "replay", cfg.replay.size, **{
        "n_step": cfg.loss.n_step, "gamma": cfg.loss.gamma, "keys": TRANSITION_KEYS, "seed": cfg.run.seed,
        "device": device, "copy_on_device": replay_copy(cfg), **kwargs})


def prepare_recipe(cfg: Any, *, seed: int | None = None) -> tuple[torch.device, Any]:
    """What every recipe does first, in this order: start the fork server its collector's workers fork from (their
    torch import overlaps the build; only where this process builds the collector: no trainer section, sync or
    ddp), set ``run.torch_threads`` (at most the cores this process may run on) and ``run.flush_denormal``, seed
    everything (``seed``: e.g. a data-parallel rank's own; default ``run.seed``), resolve ``run.device`` and make
    the env factory
    (:meth:`tdrl.envs.EnvFactory.from_config`: Atari's ``env.episodic_lives`` passed on), refusing a
    ``collector.kind`` that cannot step ``env.id`` (a VMAS id steps with ``batched_env`` only) before anything runs.
    Returns ``(device, env_factory)`` (a :class:`tdrl.envs.EnvFactory`)."""
    from tdrl.collect import start_workers_early
    from tdrl.collect.batched_env import check_kind
    from tdrl.envs import EnvFactory

    if getattr(getattr(cfg, "trainer", None), "kind", "sync") in ("sync", "ddp"):
        start_workers_early(cfg.collector.kind)
    # no more threads than the cores this process may run on (a sweep slot's, a SLURM task's): two intra-op
    # threads sharing one core make small updates 10-50x slower
    torch.set_num_threads(min(cfg.run.torch_threads, len(os.sched_getaffinity(0))))
    torch.set_flush_denormal(cfg.run.flush_denormal)
    seed_everything(cfg.run.seed if seed is None else seed)
    env_factory = EnvFactory.from_config(cfg.env)
    check_kind(cfg.collector.kind, env_factory)
    return resolve_device(cfg.run.device), env_factory



def prepare_off_policy(cfg: Any, *, algorithm: str, discrete: bool) -> tuple[torch.device, Any, Any]:
    """An off-policy recipe's first steps, in this order: :func:`check_trainer` (where ``cfg`` has a trainer
    section; the kinds it names are those the recipe wires up), :func:`prepare_recipe`, :func:`check_min_steps_learn`,
    and a ``ConfigError`` naming the other recipes when the env's action space is not the one ``algorithm`` needs
    (``discrete`` or continuous). Returns ``(device, env_factory, specs)``."""
    if hasattr(cfg, "trainer"):
        check_trainer(cfg.trainer, on_policy=False)  # before any process starts
    device, env_factory = prepare_recipe(cfg)
    check_min_steps_learn(cfg.optim.min_steps_learn, n_step=cfg.loss.n_step, batch_B=cfg.collector.batch_B)
    specs = env_factory.specs()
    if specs.discrete != discrete:
        has, needs, instead = (("continuous", "a discrete", "recipes/sac.py, td3.py or ddpg.py") if discrete
                               else ("discrete", "a continuous (Box)", "recipes/dqn.py"))
        raise ConfigError(f"env.id={cfg.env.id!r} has {has} actions; {algorithm} needs {needs} action space "
                          f"(use {instead})")
    return device, env_factory, specs
