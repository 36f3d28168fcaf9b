"""The package's layers point one way, no two modules import each other, directly or round a loop, and no module
reaches for another's _private names.

Every import is read from the source (also those inside functions, which run later but bind the modules as tightly),
so a module added without a place in LAYERS fails here until it is given one.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "attnlab"

# Bottom to top: a module imports from its own layer and those below, never from one above.
LAYERS = [
    ("validate, schema, provenance", ["attnlab.validate", "attnlab.schema", "attnlab.provenance", "attnlab.args",
                                      "attnlab.environment"]),
    ("reference and cost model", ["attnlab.reference", "attnlab.accuracy", "attnlab.cost", "attnlab.telemetry",
                                  "attnlab.ceilings"]),
    ("kernel support", ["attnlab.triton", "attnlab.triton.config", "attnlab.triton.layout", "attnlab.triton.direct"]),
    ("teaching kernels", ["attnlab.triton.tiles", "attnlab.triton.materialised", "attnlab.triton.qk_softmax",
                          "attnlab.triton.pv", "attnlab.triton.fused", "attnlab.triton.backward",
                          "attnlab.triton.fused_backward"]),
    ("Hopper kernels", ["attnlab.triton.hopper", "attnlab.triton.hopper.*"]),
    ("plans", ["attnlab.triton.plan"]),
    ("launchers", ["attnlab.triton.launch", "attnlab.triton.resources", "attnlab.triton.train_launch",
                   "attnlab.triton.fused_train"]),
    ("builds", ["attnlab.builds", "attnlab.builds.*", "attnlab.hf_attention"]),
    ("measure", ["attnlab.measure", "attnlab.profiler", "attnlab.model_forward", "attnlab.model_train"]),
    ("sweep and commands over cases", ["attnlab.sweep", "attnlab.runs", "attnlab.gate", "attnlab.grad_gate",
                                       "attnlab.warm", "attnlab.autotune", "attnlab.selfcheck", "attnlab.model_sweep",
                                       "attnlab.train_sweep"]),
    ("report", ["attnlab.report", "attnlab.report.*"]),
    ("CLI and notebooks", ["attnlab", "attnlab.bench", "attnlab.cli", "attnlab.lab", "attnlab.lab.*", "attnlab.lies",
                           "attnlab.render", "attnlab.explore", "attnlab.compare", "attnlab.exercises",
                           "attnlab.exercises.*", "attnlab.model_lab", "attnlab.page_check", "attnlab.slurm",
                           "attnlab.train_lab"]),
]

# Within the walkthrough's package, bottom to top: a module imports from its own level and those below.
LAB_LEVELS = [
    ["attnlab.lab.run", "attnlab.lab.notebook", "attnlab.lab.page"],  # the lifecycle; the first cell; page layout
    ["attnlab.lab.source"],  # where the lesson rows come from, and the formatters every section shares
    ["attnlab.lab.sections", "attnlab.lab.profiler_view", "attnlab.lab.explain", "attnlab.lab.seeds"],
    ["attnlab.lab.answers"],  # check yourself and the experiment record, computed from the sections
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        for p in patterns:
            if module == p or (p.endswith(".*") and module.startswith(p[:-1])):
                return i
    raise LookupError(module)


def is_module(name: str) -> bool:
    return (ROOT.parent / name.replace(".", "/")).with_suffix(".py").exists() \
        or (ROOT.parent / name.replace(".", "/") / "__init__.py").exists()


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` names, relative imports resolved against `package`."""
    base = node.module or ""
    if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
    return base


def imports(path: Path) -> set[str]:
    """The attnlab modules a file imports, anywhere in it; `from attnlab.x import y` counts y when y is a module."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("attnlab")}
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, package)
            if not base.startswith("attnlab"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if is_module(sub) else base)
    return found


GRAPH = {module_name(p): imports(p) - {module_name(p)} for p in sorted(ROOT.rglob("*.py"))}


def test_every_module_has_a_layer():
    unplaced = [m for m in GRAPH if not any(m == p or (p.endswith(".*") and m.startswith(p[:-1]))
                                             for _, ps in LAYERS for p in ps)]
    assert unplaced == [], f"give these modules a place in LAYERS: {unplaced}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_imports_a_layer_above_its_own(module):
    mine = layer_of(module)
    above = sorted(f"{m} ({LAYERS[layer_of(m)][0]})" for m in GRAPH[module]
                   if m in GRAPH and layer_of(m) > mine and not module.startswith(m + "."))
    assert above == [], f"{module} ({LAYERS[mine][0]}) imports from above: {above}"


def test_the_lab_package_points_one_way():
    level = {m: i for i, ms in enumerate(LAB_LEVELS) for m in ms}
    inside = sorted(m for m in GRAPH if m.startswith("attnlab.lab."))
    assert sorted(level) == inside, "give each module of attnlab.lab a place in LAB_LEVELS"
    above = sorted(f"{m} imports {w}" for m in inside for w in GRAPH[m] if level.get(w, -1) > level[m])
    assert above == []


def test_no_import_circles():
    """Tarjan's strongly connected components over the import graph: any component of two or more is a circle."""
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH or v.startswith(w + "."):  # a package's own __init__ runs first anyway
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert circles == []


def test_the_checker_sees_an_upward_import_and_a_circle(tmp_path):
    """The rules above would pass an empty graph: show they catch what they are for, on a graph made to break them."""
    global GRAPH
    saved = GRAPH
    try:
        GRAPH = {"attnlab.cost": {"attnlab.measure"}, "attnlab.measure": {"attnlab.cost"}}
        with pytest.raises(AssertionError, match="imports from above"):
            test_no_module_imports_a_layer_above_its_own("attnlab.cost")
        with pytest.raises(AssertionError):
            test_no_import_circles()
        GRAPH = {m: set() for ms in LAB_LEVELS for m in ms} | {"attnlab.lab.run": {"attnlab.lab.answers"}}
        with pytest.raises(AssertionError, match="attnlab.lab.run imports attnlab.lab.answers"):
            test_the_lab_package_points_one_way()
    finally:
        GRAPH = saved
    assert "attnlab.triton.hopper.common" in GRAPH["attnlab.triton.hopper.fused"]  # the parser follows real imports


def private_uses(source: str, module: str, is_package: bool = False) -> list[str]:
    """The other attnlab modules' _private names `module` reaches for: `m._name` where m is bound to an attnlab module
    (`import attnlab.m as m`, `from attnlab import m`, or the dotted path itself), and `from attnlab.m import _name`."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    bound = {}  # local name -> the attnlab module it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("attnlab"):
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, package)
            if not base.startswith("attnlab"):
                continue
            for a in node.names:
                if is_module(f"{base}.{a.name}"):
                    bound[a.asname or a.name] = f"{base}.{a.name}"
                elif a.name.startswith("_") and not a.name.startswith("__") and base != module:
                    found.append(f"from {base} import {a.name}")

    def dotted(node) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            head = dotted(node.value)
            return f"{head}.{node.attr}" if head else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = dotted(node.value)
            if owner and owner != module and is_module(owner):
                found.append(f"{owner}.{node.attr}")
    return sorted(set(found))


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: module_name(p))
def test_no_module_uses_another_modules_private_names(path):
    assert private_uses(path.read_text(), module_name(path), path.name == "__init__.py") == []


def test_the_private_name_checker_sees_each_way_of_reaching_in():
    source = ("import attnlab.measure\nfrom attnlab import gate as g\nfrom attnlab.sweep import _cell, ok\n"
              "from . import measure\n"
              "def f(x):\n    attnlab.measure._hidden(x); g._in_parallel(); measure._sync(x); x._fine(); g.fine()\n")
    assert private_uses(source, "attnlab.lies") == ["attnlab.gate._in_parallel", "attnlab.measure._hidden",
                                                     "attnlab.measure._sync", "from attnlab.sweep import _cell"]
    assert private_uses("from attnlab.lies import _own\nimport attnlab.lies as me\nme._x\n", "attnlab.lies") == []
