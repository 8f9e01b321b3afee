"""The import layers of docs/design.md §2, checked by an AST scan of every module (imports inside functions
count too)."""

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Which tdrl layers each layer imports (besides itself and the bare ``tdrl`` package, which holds only
# ``__version__``): exactly the edges the code has (test_the_table_lists_only_edges_the_code_has), so a new edge is
# a decision made here, with its reason, and docs/design.md §2 draws this table.
LAYERS: dict[str, set[str]] = {
    "tdrl.utils": set(),
    # The typed configs and their override parser: a base every tool layer reads.
    "tdrl.config": {"tdrl.utils"},
    "tdrl.envs": {"tdrl.utils"},
    # Models are built from an env's specs (``EnvSpecs``), so envs sits just below models.
    "tdrl.models": {"tdrl.envs", "tdrl.utils"},
    # The three siblings never import each other: they pass specs and callables.
    "tdrl.collect": {"tdrl.envs", "tdrl.models", "tdrl.utils"},
    "tdrl.replay": {"tdrl.utils"},
    "tdrl.objectives": {"tdrl.models", "tdrl.utils"},
    "tdrl.ckpt": {"tdrl.utils"},
    # The run directory owns its checkpoints (``Run`` writes them through ``tdrl.ckpt``).
    "tdrl.log": {"tdrl.ckpt", "tdrl.config", "tdrl.utils"},
    # Launch starts recipes by path, never by import, so it needs no layer above the tools.
    "tdrl.launch": {"tdrl.config", "tdrl.utils"},
    # Trainers own the loop; they reach the run (log, ckpt), models, losses, replays and evaluators through the
    # Protocols of tdrl/train/protocols.py (collectors: for annotations only).
    "tdrl.train": {"tdrl.collect", "tdrl.utils"},
    # The scale-out layer: trainers across processes (data parallel) and machines (Ray) on train's core.
    "tdrl.distributed": {"tdrl.train", "tdrl.collect", "tdrl.config", "tdrl.utils"},
    # Recipe wiring: builds every part from a recipe's config, so it sits above all of them.
    "tdrl.wiring": {"tdrl.train", "tdrl.distributed", "tdrl.collect", "tdrl.replay", "tdrl.envs", "tdrl.config",
                    "tdrl.utils"},
    # Command-line front ends over run directories and sweeps.
    "tdrl.plot": {"tdrl.log", "tdrl.config"},
    "tdrl.cli": {"tdrl.launch", "tdrl.plot"},
}
# Top-level folders outside the package: they may import any of tdrl, and tdrl never imports them.
APPLICATIONS = ("recipes", "slurm")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    """The LAYERS key ``module`` belongs to (``tdrl.collect.serial`` -> ``tdrl.collect``), or None."""
    for layer in LAYERS:
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Every module ``source`` imports, anywhere in the file, as (line, absolute dotted name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".")
                package = package[: len(package) - node.level + (1 if is_package else 0)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:  # ``from tdrl import collect`` imports the layer tdrl.collect
                submodule = f"{base}.{alias.name}"
                found.append((node.lineno, submodule if base == "tdrl" and layer_of(submodule) else base))
    return found


def check_module(source: str, module: str, is_package: bool = False) -> list[str]:
    """The layer rules ``module`` (with text ``source``) breaks, one message each."""
    problems = []
    in_tdrl = module == "tdrl" or module.startswith("tdrl.")
    layer = layer_of(module)
    if in_tdrl and module != "tdrl" and layer is None:
        return [f"{module}: not in the layer table of tests/test_layers.py; add it there"]
    for line, target in imported_modules(source, module, is_package):
        top = target.split(".")[0]
        if top in APPLICATIONS and in_tdrl:
            problems.append(f"{module}:{line} imports {target}: tdrl never imports {'/, '.join(APPLICATIONS)}/")
        if top != "tdrl" or not in_tdrl or target == "tdrl":
            continue
        target_layer = layer_of(target)
        if target_layer is None:
            problems.append(f"{module}:{line} imports {target}, which is not in the layer table")
        elif layer is not None and target_layer != layer and target_layer not in LAYERS[layer]:
            problems.append(f"{module}:{line} imports {target}: {layer} may not import {target_layer}")
    return problems


def layer_violations(root: Path) -> list[str]:
    """Scan ``tdrl/`` and the application folders under ``root`` and return every broken layer rule."""
    problems = []
    for folder in ("tdrl", *APPLICATIONS):
        for path in sorted((root / folder).rglob("*.py")):
            source = path.read_text()
            problems += check_module(source, module_name(path, root), path.name == "__init__.py")
    return problems


def used_edges(root: Path) -> dict[str, set[str]]:
    """The layers each layer of ``tdrl/`` under ``root`` imports."""
    used: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for path in sorted((root / "tdrl").rglob("*.py")):
        module = module_name(path, root)
        layer = layer_of(module)
        for _, target in imported_modules(path.read_text(), module, path.name == "__init__.py"):
            target_layer = layer_of(target)
            if layer is not None and target_layer is not None and target_layer != layer:
                used[layer].add(target_layer)
    return used


def test_the_table_lists_only_edges_the_code_has():
    used = used_edges(ROOT)
    unused = {layer: sorted(allowed - used[layer]) for layer, allowed in LAYERS.items() if allowed - used[layer]}
    assert not unused, f"LAYERS allows imports no module makes (remove them, and from docs/design.md §2): {unused}"


def test_tdrl_respects_the_design_layers():
    problems = layer_violations(ROOT)
    assert not problems, "\n".join(problems)


def test_a_planted_upward_import_is_reported(tmp_path):
    models = tmp_path / "tdrl" / "models"
    models.mkdir(parents=True)
    (tmp_path / "tdrl" / "__init__.py").write_text("__version__ = '0'\n")
    (models / "__init__.py").write_text("from tdrl.models.nets import MLP\n")
    (models / "nets.py").write_text("import torch\nfrom tdrl.utils import seeding\n\nMLP = None\n")
    (models / "bad.py").write_text("def build():\n    from tdrl.train import SyncTrainer\n    return SyncTrainer\n")
    assert layer_violations(tmp_path) == [
        "tdrl.models.bad:2 imports tdrl.train: tdrl.models may not import tdrl.train"
    ]


def test_sibling_application_and_relative_imports_are_reported():
    assert check_module("import tdrl.collect.policy\n", "tdrl.objectives.sac") == [
        "tdrl.objectives.sac:1 imports tdrl.collect.policy: tdrl.objectives may not import tdrl.collect"
    ]
    assert check_module("from .. import train\n", "tdrl.replay.buffer") == [
        "tdrl.replay.buffer:1 imports tdrl.train: tdrl.replay may not import tdrl.train"
    ]
    assert check_module("from recipes.sac import Config\n", "tdrl.launch.job") == [
        "tdrl.launch.job:1 imports recipes.sac: tdrl never imports recipes/, slurm/"
    ]
    assert check_module("from tdrl.newthing import x\n", "tdrl.utils.seeding") == [
        "tdrl.utils.seeding:1 imports tdrl.newthing, which is not in the layer table"
    ]
    # Allowed: downward, within a layer, the bare package, and anything from the applications.
    assert check_module("import tdrl\nfrom tdrl.models import MLP\nfrom . import batch\n", "tdrl.collect.serial") == []
    assert check_module("from tdrl.collect import make_collector\n", "recipes.ppo") == []


# --- Line budgets over the same table (issue 47): the shape a maintainer can see, measured per layer -------------

SCALE_OUT = ("tdrl.distributed", "tdrl.launch")
FRONT_ENDS = ("tdrl.cli", "tdrl.plot")
CORE_BUDGET, SCALE_OUT_BUDGET, MODULE_LINES = 12_000, 3_000, 400


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring (a module's, a class's, a
    function's, or an attribute's string statement)."""
    doc: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            doc.update(range(node.lineno, node.end_lineno + 1))
    code: set[int] = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            code.update(range(token.start[0], token.end[0] + 1))
    return len(code - doc)


def layer_budgets(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Code lines per layer, and every module's length in lines."""
    per_layer: dict[str, int] = {}
    lengths: dict[str, int] = {}
    for path in sorted((root / "tdrl").rglob("*.py")):
        module = module_name(path, root)
        source = path.read_text()
        layer = layer_of(module) or module
        per_layer[layer] = per_layer.get(layer, 0) + code_lines(source)
        lengths[module] = len(source.splitlines())
    return per_layer, lengths


def test_code_lines_skip_docstrings_comments_and_blanks():
    source = '"""Doc\n\nstring."""\n\nimport os  # why\n\n\nclass A:\n    """A."""\n\n    x = 1\n    """x."""\n'
    assert code_lines(source) == 3  # import, class, x = 1


def test_the_layers_stay_within_their_line_budgets():
    per_layer, lengths = layer_budgets(ROOT)
    core = sum(n for layer, n in per_layer.items() if layer not in (*SCALE_OUT, *FRONT_ENDS))
    scale_out = sum(per_layer.get(layer, 0) for layer in SCALE_OUT)
    assert core <= CORE_BUDGET, f"the library core has {core} code lines (budget {CORE_BUDGET}): {per_layer}"
    assert scale_out <= SCALE_OUT_BUDGET, f"scale-out + launch have {scale_out} code lines (budget {SCALE_OUT_BUDGET})"
    long = {module: n for module, n in lengths.items() if n > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines (split them along a seam): {long}"
