"""The package's import structure: no import cycle among its modules, no stage importing a later one, and
every workflow script's imports working in a fresh interpreter (an import cycle shows only there, in the
order the script imports: the test session has long imported everything)."""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx

from trainplan.provenance.code import closure, imports

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "workflow" / "scripts").glob("*.py"))

#: The package's subpackages and top-level modules in pipeline order, lowest first. A module imports from its
#: own entry, from the shared modules of the first layer (which may import each other) and from entries of
#: lower layers only: no stage imports a later one, and the entries of one layer are independent.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("aten_ops", "artifacts", "budget", "cli_types", "clock", "direct_kernels", "errors", "host_swap", "io", "logs",
     "memory_model", "models", "numerics", "plots", "profiler_events", "schemas", "stats", "timing", "zoo"),  # shared
    ("export",),  # trace the step; its op and tensor tables and static memory
    ("profile", "precision"),  # on the traced step: op times and the host link; per-op precision (overflow)
    ("fuse", "schedule", "align", "layout"),  # plans: fused groups (timed by the profile's run), a stage's
    # recompute/swap schedule, fp16 padding (run by precision's interpreter), conv layouts
    ("partition",),  # pipeline stages and the balance loop, which schedules every stage
    ("execute",),  # run a plan and validate it
    ("pipeline",),  # run a k-stage plan as a real pipeline: one torchrun process per stage
    ("loop",),  # plan a user's model in one call and train it under the plan in the user's own loop
    ("frontier",),  # measure plans and their exports against PyTorch's memory tools, one process per method
    ("provenance",),  # record and publish a study
    ("cli", "start_checks", "__init__"),  # the entry points (the workflow's start-up checks)
    ("config_checks",),  # the workflow's checks of its config, the model entries' by the start-up checks
)


def package_modules(src: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``src`` by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(src: Path, package: str) -> dict[str, set[str]]:
    """Each module's imports of the package's modules, wherever they stand (top level, in a function, under
    TYPE_CHECKING, a package's lazy ``__getattr__``), as trainplan.provenance.code reads them: ``from P import
    x`` imports ``P`` and the module ``P.x`` if there is one. A package the importer is inside has begun
    already: importing from it runs no ``__init__``."""
    modules = package_modules(src, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = imports(path, name)
        named = found.names.union(*found.lazy.values())
        above = {".".join(t.split(".")[:i]) for t in named if t in modules for i in range(1, t.count(".") + 1)}
        graph[name] = {t for t in (named & modules.keys()) | above
                       if t != name and own != t and not own.startswith(t + ".")}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others."""
    found = nx.strongly_connected_components(nx.DiGraph([(a, b) for a, bs in graph.items() for b in bs]))
    return sorted(sorted(group) for group in found if len(group) > 1)


def layer_entry(module: str) -> str:
    """A module's entry in LAYERS: its subpackage or top-level module (``__init__`` for the package's own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Imports from an entry of the same layer (the first, shared one excepted) or of a later one."""
    rank = {entry: i for i, layer in enumerate(layers) for entry in layer}
    out = []
    for a, targets in graph.items():
        for b in targets:
            ra, rb = rank[layer_entry(a)], rank[layer_entry(b)]
            if layer_entry(a) != layer_entry(b) and (rb > ra or rb == ra > 0):
                out.append(f"{a} -> {b}")
    return sorted(out)


def test_no_import_cycle_among_the_package_modules():
    assert import_cycles(import_graph(REPO / "src", "trainplan")) == []


def test_no_stage_imports_a_later_one():
    graph = import_graph(REPO / "src", "trainplan")
    placed = [entry for layer in LAYERS for entry in layer]
    assert len(placed) == len(set(placed))
    assert sorted({layer_entry(m) for m in graph} - set(placed)) == [], "place every new module in LAYERS"
    assert sorted(set(placed) - {layer_entry(m) for m in graph}) == [], "a LAYERS entry names no module"
    assert upward_imports(graph, LAYERS) == []


def test_the_import_checks_can_fail(tmp_path):
    """A cycle through a function's import, one through a package's ``__init__`` (run when a module inside
    it is imported from outside, not from inside), and imports across a layer and upward."""
    files = {
        "__init__.py": "",
        "a.py": "def f():\n    from toy.b import g\n",
        "b.py": "from toy import a\n",
        "c.py": "import toy.sub.d\n",
        "sub/__init__.py": "from toy.c import C\n",
        "sub/d.py": "from toy.sub import e\n",
        "sub/e.py": "",
    }
    for rel, text in files.items():
        (tmp_path / "toy" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "toy" / rel).write_text(text)
    graph = import_graph(tmp_path, "toy")
    assert graph["toy.sub.d"] == {"toy.sub.e"}
    assert import_cycles(graph) == [["toy.a", "toy.b"], ["toy.c", "toy.sub"]]
    assert upward_imports(graph, (("c",), ("a", "b"), ("sub",), ("__init__",))) == [
        "toy.a -> toy.b", "toy.b -> toy.a", "toy.c -> toy.sub", "toy.c -> toy.sub.d"]


def trainplan_imports(source: str) -> list[str]:
    """The script's top-level imports from trainplan, in order, as source lines."""
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainplan"):
            out.append(ast.unparse(node))
        elif isinstance(node, ast.Import) and any(a.name.startswith("trainplan") for a in node.names):
            out.append(ast.unparse(node))
    return out


# Imported once before the scripts' children fork: third-party only, so every trainplan module is still imported
# fresh, in each script's order, in each child (an import cycle is among trainplan's own modules).
PRELOAD = ["torch", "numpy", "pandas", "yaml", "matplotlib", "matplotlib.pyplot", "ortools.sat.python.cp_model",
           "networkx", "scipy", "jsonschema", "tqdm"]
DRIVER = """
import importlib, json, os, sys, traceback
import matplotlib
matplotlib.use("Agg")
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
assert not [m for m in sys.modules if m == "trainplan" or m.startswith("trainplan.")]
failed, loaded = {}, {}
for name, source in json.loads(sys.stdin.read()).items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            exec(compile(source, name, "exec"), {"__name__": "__main__"})
            os.write(write, json.dumps(sorted(m for m in sys.modules if m.partition(".")[0] == "trainplan")).encode())
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc().strip().splitlines()[-1].encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    if os.waitpid(pid, 0)[1] != 0:
        failed[name] = said or "the child died"
    else:
        loaded[name] = json.loads(said)
print(json.dumps({"failed": failed, "loaded": loaded}))
"""


def run_driver(sources: dict[str, str], preload: list[str], env: dict[str, str] | None = None) -> dict:
    """DRIVER on ``sources`` (name -> import lines): ``failed`` (name -> last error line) and ``loaded`` (name ->
    the trainplan modules its imports loaded)."""
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(preload)], input=json.dumps(sources),
                         capture_output=True, text=True, check=False, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@functools.cache
def script_imports() -> dict:
    """run_driver over every workflow script's trainplan imports (once a session: two tests read it)."""
    sources = {}
    for script in SCRIPTS:
        lines = trainplan_imports(script.read_text())
        assert lines, f"{script.name} imports nothing from trainplan"
        sources[script.name] = "\n".join(lines)
    return run_driver(sources, PRELOAD)


def test_every_script_imports_in_a_fresh_interpreter():
    """Each script's trainplan imports run in a child forked from an interpreter that has imported only
    third-party packages (one interpreter per script took 40-50 s on a 2-core host)."""
    assert script_imports()["failed"] == {}


def test_a_rules_code_closure_holds_every_module_its_script_loads():
    """trainplan.provenance.code's closure of each script (what its rule's code version hashes) holds every
    trainplan module the script's imports really load (read from sys.modules in the child), and at least one."""
    loaded = script_imports()["loaded"]
    assert sorted(loaded) == [script.name for script in SCRIPTS]
    for script in SCRIPTS:
        found = closure(REPO, f"workflow/scripts/{script.name}").modules
        assert loaded[script.name] and set(loaded[script.name]) <= found, (script.name, set(loaded[script.name]) - found)


def test_an_import_cycle_fails_the_check(tmp_path):
    """The check can fail: two modules importing a name from each other, in a package on the path."""
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from cyclic.a import A\nB = 2\n")
    failed = run_driver({"ok": "import json", "bad": "from cyclic.a import A"}, ["json"],
                        env={**os.environ, "PYTHONPATH": str(tmp_path)})["failed"]
    assert list(failed) == ["bad"] and "ImportError" in failed["bad"] and "circular" in failed["bad"]


def test_the_solver_rules_do_not_load_torch():
    """The partition, schedule and balance rules read tables and solve: their imports do not load torch (1.5 s a
    job here, 1-4 dozen jobs a study). Before, ``is_inplace`` lived beside the exporter and brought torch in."""
    names = ("partition.py", "schedule.py", "balance.py")
    lines = [line for script in SCRIPTS if script.name in names for line in trainplan_imports(script.read_text())]
    assert len(lines) >= 3
    probe = "\n".join([*lines, "import sys", "print('torch' in sys.modules)"])
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_the_workflow_starts_without_importing_torch():
    """What the rule files import when Snakemake reads them (every start, a dry run too) imports no torch (2.5-5 s
    on a 2-core host; the checks that need it run only on what was not checked before, start_checks)."""
    lines = []
    for rules in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        lines += [line for line in rules.read_text().splitlines()
                  if line.startswith(("from trainplan", "import trainplan"))]
    assert len(lines) >= 8
    out = subprocess.run([sys.executable, "-c", "\n".join([*lines, "import sys", "print('torch' in sys.modules)"])],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "False"
