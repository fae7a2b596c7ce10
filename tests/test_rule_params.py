"""Protects reruns: Snakemake reruns a job when its params change, not when a config value its
script reads behind its back changes. So a rule's script (and the workflow modules it imports)
reads settings only through snakemake.params, every params/input/output name it reads exists on
its rule, and whole-config reads are limited to the one tag that names the config (its hash)."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "workflow" / "scripts"

# The rules as Snakemake itself parses them (default and paper configs: some rules exist in one).
_DUMP = r"""
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, ResourceSettings
rules = {}
for configfiles in ([], [Path("config/paper.yaml")]):
    with SnakemakeApi() as api:
        wf = api.workflow(snakefile=Path("Snakefile"), resource_settings=ResourceSettings(),
                          config_settings=ConfigSettings(configfiles=configfiles), workdir=Path("."))
        for r in wf._workflow.rules:
            if not r.script:
                continue
            def names(files):  # None where a function builds them (unpack): known per job only
                return None if any(callable(f) or f.is_callable() for f in files) else sorted(files._names)
            entry = rules.setdefault(r.name, {"script": r.script, "params": [], "input": [], "output": []})
            entry["params"] = sorted(set(entry["params"]) | set(r.params._names))
            for kind in ("input", "output"):
                got = names(getattr(r, kind))
                entry[kind] = None if got is None or entry[kind] is None else sorted(set(entry[kind]) | set(got))
json.dump(rules, sys.stdout)
"""


@pytest.fixture(scope="module")
def rules():
    r = subprocess.run([sys.executable, "-c", _DUMP], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def snakemake_reads(source: str, filename: str) -> tuple[list[str], dict[str, set[str]]]:
    """(whole-config reads outside config_hash(...), {"params"|"input"|"output": names read}) of
    one module, following `sm = snakemake` aliases."""
    tree = ast.parse(source, filename)
    aliases = {"snakemake"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    hashed = {id(a.args[0]) for a in ast.walk(tree) if isinstance(a, ast.Call) and a.args
              and getattr(a.func, "id", None) == "config_hash"}

    def is_sm(node):
        return isinstance(node, ast.Name) and node.id in aliases

    config_reads, named = [], {"params": set(), "input": set(), "output": set()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_sm(node.value) and node.attr == "config" and id(node) not in hashed:
            config_reads.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and is_sm(node.value.value) \
                and node.value.attr in named:
            named[node.value.attr].add(node.attr)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") \
                and isinstance(node.args[0], ast.Attribute) and is_sm(node.args[0].value) \
                and node.args[0].attr in named and isinstance(node.args[1], ast.Constant):
            named[node.args[0].attr].add(node.args[1].value)
    return config_reads, named


def local_modules(path: Path) -> list[Path]:
    """The script and the workflow/scripts modules it imports, transitively."""
    seen, todo = [], [path]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        for node in ast.walk(ast.parse(p.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            todo += [SCRIPTS / f"{n}.py" for n in names if (SCRIPTS / f"{n}.py").is_file()]
    return seen


# Names Snakemake's namedlists have as methods or attributes, not rule-declared names.
NAMEDLIST_API = {"get", "keys", "items", "size_files", "size_files_mb", "size_files_gb", "size_files_kb"}


def test_scripts_read_settings_only_through_their_rules_params(rules):
    assert {"phase", "eval", "gather", "table", "figure", "claims", "convert", "download"} <= set(rules)
    problems = []
    for rule, spec in sorted(rules.items()):
        script = (ROOT / "workflow" / "rules" / spec["script"]).resolve()
        for module in local_modules(script):
            config_reads, named = snakemake_reads(module.read_text(), module.name)
            problems += [f"rule {rule}: {read} (pass it as a rule param)" for read in config_reads]
            for kind, names in named.items():
                if spec[kind] is None:  # built by a function (unpack): names known only per job
                    continue
                problems += [f"rule {rule}: {module.name} reads snakemake.{kind}.{n}, which the rule does not declare"
                             for n in sorted(names - set(spec[kind]) - NAMEDLIST_API)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source, config_reads, params", [
    ("x = snakemake.config['eval']['seed']", 1, set()),
    ("sm = snakemake\nx = sm.config.get('eval')", 1, set()),
    ("tags = {'config_hash': config_hash(snakemake.config)}", 0, set()),
    ("sm = snakemake\ny = sm.params.nope + getattr(sm.params, 'other', 0)", 0, {"nope", "other"}),
])
def test_the_walk_sees_config_and_param_reads(source, config_reads, params):
    """The check above can fail: a config read behind a rule's back and an undeclared param are seen."""
    reads, named = snakemake_reads(source, "probe.py")
    assert len(reads) == config_reads
    assert named["params"] == params
