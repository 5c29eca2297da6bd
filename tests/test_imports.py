"""Every workflow script's imports work in a fresh interpreter: an import cycle shows only there, in the
order the script imports (the test session has long imported everything)."""

from __future__ import annotations

import ast
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


def test_every_script_imports_in_a_fresh_interpreter():
    procs = {}
    for script in SCRIPTS:
        lines = trainplan_imports(script.read_text())
        assert lines, f"{script.name} imports nothing from trainplan"
        procs[script.name] = subprocess.Popen([sys.executable, "-c", "\n".join(lines)], stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True)
    failed = {name: p.communicate()[1].strip().splitlines()[-1:] for name, p in procs.items() if p.wait() != 0}
    assert not failed, failed
