"""melt_core's layers: each subpackage imports only the layers below it (its docstring says which),
no module import cycle, counting imports inside functions too (a cycle held together by a
function-level import is still a cycle), and each module imports on its own."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "melt_core"
# every module by its dotted name under melt_core ("modeling.cache", "data")
MODULES = sorted(".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
                 if p.name != "__init__.py")
LEAVES = {"data", "tracking"}  # melt_core/*.py: import nothing of melt_core, importable from every layer
# the layers and what each may import (the subpackages' docstrings say the same)
MAY_IMPORT = {
    "modeling": set(),
    "generation": {"modeling"},
    "serving": {"modeling", "generation"},
    "training": {"modeling", "generation"} | LEAVES,
    "evaluation": {"modeling", "generation", "serving"} | LEAVES,
    "ops": {"modeling", "generation", "serving", "training", "evaluation"} | LEAVES,
}


def path_of(module: str) -> Path:
    return PACKAGE.joinpath(*module.split(".")).with_suffix(".py")


def layer(module: str) -> str:
    return module.split(".")[0]


def needs_vllm(module: str) -> bool:
    """Whether ``module`` imports vLLM at its top level: it imports only in the serving environment."""
    tree = ast.parse(path_of(module).read_text())
    return any((isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "vllm")
               or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in n.names))
               for n in tree.body)


SERVING = [m for m in MODULES if needs_vllm(m)]


def resolve(module: str, node: ast.ImportFrom) -> list[str]:
    """The melt_core modules one ``from ... import ...`` in ``module`` names."""
    if node.level:
        package = module.split(".")[:-1]
        base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
        if node.level - 1 > len(package):
            raise AssertionError(f"{module}: relative import above melt_core")
        base = ".".join(base + ([node.module] if node.module else []))
    elif (node.module or "") == "melt_core" or (node.module or "").startswith("melt_core."):
        base = node.module.removeprefix("melt_core").lstrip(".")
    else:
        return []
    # `from .x import y` names x; `from . import x` / `from melt_core.pkg import x` name the modules x
    names = [f"{base}.{a.name}" if base else a.name for a in node.names]
    return [n for n in names if n in MODULES] or ([base] if base in MODULES else [])


def imports_of(module: str) -> set[str]:
    """The melt_core modules ``module`` imports, anywhere in its file."""
    found = set()
    for node in ast.walk(ast.parse(path_of(module).read_text())):
        if isinstance(node, ast.ImportFrom):
            found |= set(resolve(module, node))
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("melt_core.") for a in node.names
                      if a.name.removeprefix("melt_core.") in MODULES and a.name.startswith("melt_core.")}
    return found - {module}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (a -> b -> ... -> a), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points from a layer to one it may not import (a leaf imports nothing)."""
    bad = []
    for module, deps in sorted(graph.items()):
        allowed = set() if module in LEAVES else MAY_IMPORT[layer(module)] | {layer(module)}
        bad += [f"{module} imports {d}" for d in sorted(deps) if (d if d in LEAVES else layer(d)) not in allowed]
    return bad


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_walk_sees_imports_of_every_form():
    graph = {m: imports_of(m) for m in MODULES}
    assert graph["evaluation.lighteval_adapter"] >= {"evaluation.evaluate", "serving.inference",
                                                      "evaluation.lighteval_tasks", "data", "tracking"}
    assert "modeling.checkpoint" in graph["ops.download"]  # from ..modeling.checkpoint import
    assert "modeling.checkpoint" in graph["training.train"]  # from ..modeling import checkpoint as ck
    assert "evaluation.code_harness" in graph["evaluation.code_tasks"]  # from . import code_harness
    assert "serving.vllm_engine" in graph["serving.inference"]  # an import inside a function
    assert layer_violations({"modeling.cache": {"training.train"}, "data": {"modeling.config"}}) == [
        "data imports modeling.config", "modeling.cache imports training.train"]


def test_every_module_lives_in_a_layer_or_is_a_leaf():
    assert {layer(m) for m in MODULES if m not in LEAVES} == set(MAY_IMPORT)
    for pkg in MAY_IMPORT:  # each layer's docstring says what it owns and what it may import
        doc = ast.get_docstring(ast.parse((PACKAGE / pkg / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"melt_core/{pkg}/__init__.py: its docstring must say what it may import"


def test_imports_point_down_the_layers_and_form_no_cycle():
    graph = {m: imports_of(m) for m in MODULES}
    assert layer_violations(graph) == []
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in melt_core: " + " -> ".join(cycle)


def import_each(python: str, modules: list[str]) -> subprocess.CompletedProcess:
    code = f"""
import importlib, sys, traceback
failed = []
for name in {modules!r}:
    for loaded in [m for m in sys.modules if m == "melt_core" or m.startswith("melt_core.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module("melt_core." + name)
    except Exception:
        failed.append(name + ":\\n" + traceback.format_exc(limit=3))
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""
    return subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_each_module_imports_on_its_own():
    """In one fresh interpreter, each module imported with no other melt_core module loaded before it
    (third-party packages stay loaded: only the order inside melt_core is under test); the modules that
    import vLLM in the serving environment, where vLLM is (the rest must not need it)."""
    # the walk sees vLLM imports; nothing else needs vLLM
    assert SERVING == ["serving.vllm_models", "serving.vllm_scheduler"]
    r = import_each(sys.executable, [m for m in MODULES if m not in SERVING])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    from melt_core.serving.vllm_engine import vllm_python

    r = import_each(str(vllm_python()), SERVING + ["serving.vllm_plugin", "serving.vllm_worker", "serving.vllm_engine"])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
