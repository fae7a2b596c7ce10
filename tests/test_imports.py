"""melt_core's modules form layers: no import cycle, counting imports inside functions too (a cycle
held together by a function-level import is still a cycle), and each module imports on its own."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "melt_core"
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def needs_vllm(module: str) -> bool:
    """Whether ``module`` imports vLLM at its top level: it imports only in the serving environment."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    return any((isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "vllm")
               or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in n.names))
               for n in tree.body)


SERVING = [m for m in MODULES if needs_vllm(m)]


def imports_of(module: str) -> set[str]:
    """The melt_core modules ``module`` imports, anywhere in its file."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1 or base == "melt_core" or base.startswith("melt_core."):
                base = base.removeprefix("melt_core").lstrip(".")
                # `from . import x` / `from melt_core import x` name modules; `from .x import y` names x
                names = [a.name for a in node.names] if not base else [base.split(".")[0]]
                found |= {n for n in names if n in MODULES}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names
                      if a.name.startswith("melt_core.") and a.name.split(".")[1] in MODULES}
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


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_melt_core_has_no_import_cycle():
    graph = {m: imports_of(m) for m in MODULES}
    assert graph["lighteval_adapter"] >= {"evaluate", "inference", "lighteval_tasks"}  # the walk sees imports
    assert "checkpoint" in imports_of("download")
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
    assert SERVING == ["vllm_models", "vllm_scheduler"]  # the walk sees vLLM imports; nothing else needs vLLM
    r = import_each(sys.executable, [m for m in MODULES if m not in SERVING])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    from melt_core.serving import vllm_python

    r = import_each(str(vllm_python()), SERVING + ["vllm_plugin", "vllm_worker", "serving"])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
