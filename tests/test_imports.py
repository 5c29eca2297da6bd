"""Every workflow script's imports work in a fresh interpreter: an import cycle shows only there, in the
order the script imports (the test session has long imported everything)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "workflow" / "scripts").glob("*.py"))


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
failed = {}
for name, source in json.loads(sys.stdin.read()).items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            exec(compile(source, name, "exec"), {"__name__": "__main__"})
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc().strip().splitlines()[-1].encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        error = pipe.read()
    if os.waitpid(pid, 0)[1] != 0:
        failed[name] = error or "the child died"
print(json.dumps(failed))
"""


def test_every_script_imports_in_a_fresh_interpreter():
    """Each script's trainplan imports run in a child forked from an interpreter that has imported only
    third-party packages (one interpreter per script took 40-50 s on a 2-core host)."""
    sources = {}
    for script in SCRIPTS:
        lines = trainplan_imports(script.read_text())
        assert lines, f"{script.name} imports nothing from trainplan"
        sources[script.name] = "\n".join(lines)
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(PRELOAD)], input=json.dumps(sources),
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == {}


def test_an_import_cycle_fails_the_check(tmp_path):
    """The check can fail: two modules importing a name from each other, in a package on the path."""
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from cyclic.a import A\nB = 2\n")
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(["json"])],
                         input=json.dumps({"ok": "import json", "bad": "from cyclic.a import A"}),
                         capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    failed = json.loads(out.stdout)
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
