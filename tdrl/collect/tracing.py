"""A user's ``nn.Module`` as one plain function, through ``torch.fx``, for the collectors' per-step policy call.

A custom network (``class Net(nn.Module)`` whose ``forward`` calls its layers) pays ``nn.Module.__call__`` for
itself and for every layer each step: on this CPU a call costs about as much as a 64-wide layer's arithmetic, so a
2×64 MLP over the 16 envs of one worker spends ~30 % of its forward in calls. :func:`traced_call` traces the module
once with ``torch.fx`` and returns a function that runs the recorded operations directly: ``Linear`` layers and
elementwise activations as ``F.linear``/``torch.tanh`` on the layers' *current* tensors, every other layer module
as itself, tensor attributes read at call time (so in-place weight syncs and swapped tensors are followed).

A trace is one recorded run of ``forward``: Python-level decisions (``if self.flag``, ``random.random() < eps``)
are frozen into it. A module is therefore traced only when that cannot change its results:

* the trace succeeds (tensor-dependent Python control flow or ``.item()`` make it fail);
* tracing left every module's Python attributes as they were (``forward`` keeps no counters or caches);
* the code ``forward`` can reach (the methods of the traced classes and the plain Python functions they call)
  writes no attributes or globals and names no ``random``, clock or ``print`` (draws must be tensor ops, which
  the trace keeps);

and :meth:`ModuleWatch.stale` reports when anything a trace may have read has changed since: a plain Python
attribute of any module in the tree (``training``, flags, scales), its child modules, or its hooks.
:class:`tdrl.collect.policy.PolicyStep` checks that before every batch and rebuilds, and compares the result with
the module's own forward before using it.

Plain MLPs need no trace: :func:`plain_layers` lists their ``Linear`` layers and activations as functions, and
:class:`HeadedMLP` runs the body of ``nn.Sequential(*mlp, head)`` that way for the losses that evaluate a policy
several times per update (``FusedSACLoss``, ``FusedTD3Loss``).
"""

from __future__ import annotations

import dis
import inspect
import operator
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

__all__ = [
    "ACTIVATIONS",
    "HeadedMLP",
    "ModuleWatch",
    "chain",
    "global_hooks",
    "hooked",
    "layer_function",
    "plain_layers",
    "traced_call",
]

ACTIVATIONS: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    torch.nn.Tanh: torch.tanh,
    torch.nn.ReLU: torch.relu,
    torch.nn.Sigmoid: torch.sigmoid,
    torch.nn.Identity: lambda x: x,
}
"""Elementwise activation modules and the functions that compute them."""

_PLAIN = (bool, int, float, str, type(None))
_WRITES = {"STORE_ATTR", "DELETE_ATTR", "STORE_GLOBAL", "DELETE_GLOBAL"}
_IMPURE_NAMES = {"random", "print", "time", "perf_counter", "monotonic", "input", "open"}
_LIBRARIES = ("torch", "numpy", "math", "tensordict", "torchrl", "operator", "functools", "typing")


def hooked(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def global_hooks() -> bool:
    """Whether module hooks are registered for every module (then direct calls must go through the modules)."""
    registry = torch.nn.modules.module
    return bool(registry._global_forward_hooks or registry._global_forward_pre_hooks)


def _library(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] in _LIBRARIES


def _user_function(obj: Any) -> types.FunctionType | None:
    """The plain function behind ``obj`` (a function, static/class method or property), unless a library's."""
    func = obj.fget if isinstance(obj, property) else getattr(obj, "__func__", obj)
    return func if isinstance(func, types.FunctionType) and not _library(func) else None


def _pure(func: types.FunctionType, cls: type, seen: set[types.CodeType]) -> bool:
    """``func`` writes no attributes or globals and names nothing impure; nor do the user functions it can reach
    (the globals it loads, and the methods it names in ``cls`` and its bases)."""

    def check(code: types.CodeType) -> bool:
        if code in seen:
            return True
        seen.add(code)
        if _IMPURE_NAMES & set(code.co_names):
            return False
        reached = []
        for ins in dis.get_instructions(code):
            if ins.opname in _WRITES:
                return False
            if ins.opname == "LOAD_GLOBAL":
                reached.append(_user_function(func.__globals__.get(ins.argval)))
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):  # every class's method of that name (super() too)
                reached += [_user_function(vars(k).get(ins.argval)) for k in cls.__mro__]
        nested = [c for c in code.co_consts if isinstance(c, types.CodeType)]
        return all(check(c) for c in nested) and all(f is None or _pure(f, cls, seen) for f in reached)

    return check(func.__code__)


def _traced_classes_pure(module: torch.nn.Module, tracer: fx.Tracer) -> bool:
    """The ``forward`` of every module the tracer runs through (non-leaf modules) is :func:`_pure`."""
    seen: set[types.CodeType] = set()
    for name, sub in module.named_modules():
        if name and tracer.is_leaf_module(sub, name):
            continue
        forward = _user_function(inspect.getattr_static(type(sub), "forward", None))
        if forward is not None and not _pure(forward, type(sub), seen):
            return False
    return True


def layer_function(layer: torch.nn.Module) -> Callable[..., Any]:
    """``layer(x)`` without ``nn.Module.__call__`` where that is safe: ``F.linear`` on a ``Linear``'s current tensors,
    an activation's function, else the layer's own call.

    ``layer.weight`` goes through ``nn.Module.__getattr__`` (~0.6 µs per read on this CPU), so the tensors are read
    from the layer's dicts each call: the instance dict first (tensordict's ``to_module`` puts plain tensors there),
    then ``_parameters``, as attribute lookup does.
    """
    if type(layer) is torch.nn.Linear and not hooked(layer):
        attrs, params = layer.__dict__, layer._parameters

        def linear(x: torch.Tensor) -> torch.Tensor:
            weight = attrs["weight"] if "weight" in attrs else params["weight"]
            bias = attrs["bias"] if "bias" in attrs else params["bias"]
            return torch.nn.functional.linear(x, weight, bias)

        return linear
    if type(layer) in ACTIVATIONS and not hooked(layer):
        return ACTIVATIONS[type(layer)]

    def call(*args: Any, **kwargs: Any) -> Any:
        return layer(*args, **kwargs)

    return call


def chain(module: torch.nn.Module) -> bool:
    """Whether ``module`` calls its children in turn on one input: an ``nn.Sequential`` (or a subclass keeping its
    ``forward``), or TorchRL's ``MLP`` with one input."""
    from torchrl.modules import MLP

    sequential = isinstance(module, torch.nn.Sequential) and type(module).forward is torch.nn.Sequential.forward
    return sequential or (type(module) is MLP and isinstance(module.out_features, int))


def plain_layers(module: torch.nn.Module) -> list[Callable[[torch.Tensor], torch.Tensor]] | None:
    """The layers of a plain MLP as functions (:func:`layer_function`), in call order, or ``None``.

    Plain: ``nn.Sequential`` chains (subclasses that keep its ``forward``, and TorchRL's ``MLP`` with one input),
    nested, of ``Linear`` layers and elementwise activations, without hooks. Calling the functions in turn equals
    calling the module while :class:`ModuleWatch` sees no change and no global hooks are registered.
    """
    if type(module) is torch.nn.Linear or type(module) in ACTIVATIONS:
        return None if hooked(module) else [layer_function(module)]
    if hooked(module) or not chain(module):
        return None
    layers: list[Callable[[torch.Tensor], torch.Tensor]] = []
    for child in module:
        inner = plain_layers(child)
        if inner is None:
            return None
        layers += inner
    return layers


class HeadedMLP:
    """``nn.Sequential(*body, head)`` with a head of a known type, its body run as layer functions.

    For losses that evaluate a policy network several times per update (``nn.Module.__call__`` costs ~10 us per
    layer on a slow CPU). Calling it equals calling the network. :meth:`body` returns the body's output alone (for a
    caller that computes the head its own way, e.g. SAC reading the log-std before its ``exp``), or ``None`` when
    the network is not of that form, has hooks, or global hooks are registered: the caller then calls the network.
    A change :class:`ModuleWatch` sees rebuilds. Copies and pickles carry only the network (the layer functions
    close over its modules' dicts).
    """

    def __init__(self, net: torch.nn.Module, head_type: type) -> None:
        self.net, self.head_type = net, head_type
        self._layers: list[Callable[[torch.Tensor], torch.Tensor]] | None = None
        self._watch: ModuleWatch | None = None

    @property
    def head(self) -> torch.nn.Module:
        return self.net[-1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``net(x)``: the body as layer functions, then the head's ``forward`` (checked unhooked), where possible."""
        body = self.body(x)
        return self.net(x) if body is None else self.head.forward(body)

    def body(self, x: torch.Tensor) -> torch.Tensor | None:
        if self._watch is None or self._watch.stale():
            self._layers, self._watch = self._build(), ModuleWatch(self.net)
        if self._layers is None or global_hooks():
            return None
        for layer in self._layers:
            x = layer(x)
        return x

    def _build(self) -> list[Callable[[torch.Tensor], torch.Tensor]] | None:
        net = self.net
        if not (chain(net) and len(net) >= 2 and type(net[-1]) is self.head_type
                and not hooked(net) and not hooked(net[-1])):
            return None
        parts = [plain_layers(child) for child in list(net)[:-1]]
        return None if any(part is None for part in parts) else [f for part in parts for f in part]

    def __getstate__(self) -> dict[str, Any]:
        return {"net": self.net, "head_type": self.head_type, "_layers": None, "_watch": None}


def _attribute_reader(owner: torch.nn.Module, name: str) -> Callable[[], Any]:
    def read() -> Any:
        return getattr(owner, name)

    return read


class ModuleWatch:
    """Remembers what a direct call of ``module`` was built from; :meth:`stale` says when to build it again.

    What counts, per module of the tree: its plain attributes (``bool``/``int``/``float``/``str``/``None`` values of
    the instance dict, e.g. ``training``), whether it has hooks, and its child modules. Checked before every batch,
    so at ``batch_T = 1`` (one env step per batch, the off-policy recipes) it must be cheap: a module whose instance
    dict holds values of the same types in the same order, with equal plain values, is unchanged (C-level tuple
    operations, ~1 µs per module); only otherwise are its plain attributes compared key by key (a tensor stored on
    the module is not a change) and the snapshot renewed.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.snapshots = [_Snapshot(m) for m in module.modules()]

    def stale(self) -> bool:
        """Whether a plain Python attribute, child module or hook in the tree changed since."""
        for i, snap in enumerate(self.snapshots):
            if not snap.same_structure():
                return True
            if snap.same_dict():
                continue
            renewed = _Snapshot(snap.module)  # the slow comparison, on this module only
            if renewed.plain_attrs != snap.plain_attrs:
                return True
            self.snapshots[i] = renewed  # only non-plain values changed: next time the fast check holds again
        return False


class _Snapshot:
    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.dict = module, vars(module)
        self.plain_attrs = {k: v for k, v in self.dict.items() if type(v) in _PLAIN}
        keys = list(self.plain_attrs)
        self.get_plain = operator.itemgetter(*keys, *keys) if keys else (lambda _: ())  # >= 2 keys: a tuple
        self.plain_values = self.get_plain(self.dict)
        self.types = tuple(map(type, self.dict.values()))
        self.hooked = hooked(module)
        self.children = tuple(module._modules.values())

    def same_structure(self) -> bool:
        return hooked(self.module) == self.hooked and tuple(self.module._modules.values()) == self.children

    def same_dict(self) -> bool:
        """Fast check: same value types in the same order and equal plain values (``False`` may be a false alarm)."""
        try:
            return tuple(map(type, self.dict.values())) == self.types and self.get_plain(self.dict) == self.plain_values
        except KeyError:
            return False


def traced_call(module: torch.nn.Module) -> Callable[..., Any] | None:
    """``module`` traced into one function (see the module docstring), or ``None`` where that is not safe.

    Modules of the libraries (``torch.nn`` layers, TorchRL's modules) are not traced. The function calls the
    module itself while global module hooks are registered.
    """
    if _library(type(module)) or hooked(module):
        return None
    tracer = fx.Tracer()
    if not _traced_classes_pure(module, tracer):
        return None
    watch = ModuleWatch(module)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = tracer.trace(module)
    except Exception:  # untraceable forward: the module keeps its own call
        return None
    if watch.stale():
        return None
    flat = fx.Graph()
    values: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            fn = layer_function(module.get_submodule(node.target))
            values[node] = flat.call_function(fn, fx.node.map_arg(node.args, values.__getitem__),
                                              fx.node.map_arg(node.kwargs, values.__getitem__))
        elif node.op == "get_attr":
            owner_name, _, name = node.target.rpartition(".")
            values[node] = flat.call_function(_attribute_reader(module.get_submodule(owner_name), name))
        else:
            values[node] = flat.node_copy(node, values.__getitem__)
    forward = fx.GraphModule(torch.nn.Module(), flat).forward

    def run(*inputs: Any) -> Any:
        return module(*inputs) if global_hooks() else forward(*inputs)

    return run
