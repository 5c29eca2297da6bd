"""Every workflow script's imports work in a fresh interpreter: an import cycle shows only there, in the
order the script imports (the test session has long imported everything)."""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

from trainplan.provenance.code import closure

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "workflow" / "scripts").glob("*.py"))


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
