"""Multi-agent envs by id: the ``PettingZoo`` family of :mod:`tdrl.envs.families`, built as a
:class:`~tdrl.envs.multiagent.GroupedEnv`.

Env ids (the ``PettingZoo`` family of :mod:`tdrl.envs.families`, so ``EnvFactory("mpe2/simple_spread_v3")`` and
``env.id=mpe2/simple_spread_v3`` build them; extra ``tdrl[marl]``): ``mpe2/<env>``, ``pettingzoo/<family>/<env>``
(``pettingzoo/butterfly/pistonball_v6``; an env with only PettingZoo's turn-based AEC API, such as
``pettingzoo/classic/tictactoe_v3``, steps one turn at a time: :mod:`tdrl.envs.turn_based`), ``lbforaging/<id>``
(``lbforaging/Foraging-8x8-2p-2f-coop-v3``; its time limit becomes a truncation). Keyword arguments
(``EnvFactory``'s ``kwargs``): ``group_map``, ``state`` (False drops the global state), ``flatten`` (turn-based
envs; False keeps board-shaped observations) and the env's own (``N``, ``local_ratio``, ``continuous_actions``...);
``max_episode_steps`` is tdrl's cut.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from tdrl.envs.families import EnvError
from tdrl.envs.multiagent import GroupedEnv
from tdrl.envs.tuple_agents import TupleAgents
from tdrl.envs.turn_based import TurnBasedAgents

__all__ = ["PREFIXES", "TupleAgents", "is_multiagent", "make_multiagent"]

PREFIXES = ("mpe2/", "pettingzoo/", "lbforaging/")
EXTRA = "pip install 'tdrl[marl]'"


def is_multiagent(env_id: str) -> bool:
    """Whether ``env_id`` names a multi-agent env (:func:`make_multiagent`)."""
    return env_id.startswith(PREFIXES)


def _import(package: str, module: str, env_id: str) -> Any:
    """``package.module``, with a one-line :class:`EnvError` naming the extra or the known envs."""
    try:
        importlib.import_module(package)
    except ImportError:
        raise EnvError(f"environment '{env_id}' needs {package.split('.')[0]}: {EXTRA}") from None
    if not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*", module):
        raise EnvError(f"unknown environment id '{env_id}'")
    target = f"{package}.{module}"
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as err:
        missing = err.name or target
        if target != missing and not target.startswith(f"{missing}."):  # the env imports a package not installed
            raise EnvError(f"environment '{env_id}' needs the {missing.split('.')[0]} package, which tdrl[marl] does "
                           f"not install: pip install {missing.split('.')[0]}") from None
        raise EnvError(f"unknown environment id '{env_id}'{_known_hint(target)}") from None


def _known_hint(target: str) -> str:
    """``; <package> has <env>, ...``: the env modules of the deepest package of ``target`` that imports."""
    parent = target.rpartition(".")[0]
    while parent:
        try:
            root = importlib.import_module(parent)
            break
        except ImportError:
            parent = parent.rpartition(".")[0]
    else:
        return ""
    known = sorted(m.name for m in pkgutil.iter_modules(getattr(root, "__path__", [])) if not m.ispkg
                   and re.search(r"_v\d+$", m.name))
    return f"; {parent} has {', '.join(known)}" if known else ""


def make_multiagent(env_id: str, max_episode_steps: int | None = None, kwargs: Mapping[str, Any] | None = None
                    ) -> GroupedEnv:
    """Build the multi-agent env ``env_id`` (module docstring) as a :class:`GroupedEnv`; ``kwargs`` hold
    ``group_map``, ``state`` and the env's own arguments. Raises :class:`~tdrl.envs.EnvError` (one line) for an
    unknown id, a missing extra or a bad group map."""
    options = dict(kwargs or {})
    grouping = {"group_map": options.pop("group_map", None), "state": options.pop("state", True)}
    family, _, name = env_id.partition("/")
    if family == "lbforaging":
        _import("lbforaging", "foraging", env_id)
        if name not in gym.registry:
            raise EnvError(f"unknown environment id '{env_id}' (lbforaging ids look like "
                           "'lbforaging/Foraging-8x8-2p-2f-coop-v3')")
        limit = gym.spec(name).kwargs.get("max_episode_steps") if max_episode_steps is None else max_episode_steps
        # lbforaging ends a timed-out episode as terminated; tdrl cuts it at the same step as truncated
        try:
            inner = gym.make(name, disable_env_checker=True, **{**options, "max_episode_steps": 2**31 - 1}).unwrapped
        except TypeError as err:  # an argument it does not take (e.g. continuous_actions); gym adds every kwarg
            raise EnvError(f"environment '{env_id}': {str(err).partition(' was raised from')[0]}") from None
        return GroupedEnv(TupleAgents(inner), max_episode_steps=limit, **grouping)
    package, module = ("mpe2", name) if family == "mpe2" else ("pettingzoo", name.replace("/", "."))
    source = _import(package, module, env_id)
    parallel = callable(getattr(source, "parallel_env", None))
    if not parallel and not callable(getattr(source, "env", None)):
        raise EnvError(f"environment '{env_id}' has neither parallel_env nor env (PettingZoo's two APIs)")
    flatten = bool(options.pop("flatten", True)) if not parallel else True
    try:
        env = source.parallel_env(**options) if parallel else TurnBasedAgents(source.env(**options), flatten)
    except TypeError as err:
        raise EnvError(f"environment '{env_id}': {err}") from None
    except ImportError as err:  # an env that imports what it needs when built (PettingZoo's hanabi: open_spiel)
        raise EnvError(f"environment '{env_id}' cannot be built here: {err}") from None
    return GroupedEnv(env, max_episode_steps=max_episode_steps, **grouping)
