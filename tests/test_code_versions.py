"""Code versions of the rules (trainplan.provenance.code, common.smk's code_version): each rule's version is the
digest of the checkout's files its script runs, so that editing one reruns exactly the rules that run it."""

from __future__ import annotations

import modulefinder
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from workflow_run import REPO, TINY, copy_of_study

from trainplan.provenance.code import CodeError, closure, digest

SCRIPTS = sorted((REPO / "workflow" / "scripts").glob("*.py"))
RULE = re.compile(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^(?:rule|checkpoint) |\Z)", re.S | re.M)


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A repository at ``root`` with these files (path -> text)."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


PACKAGE = {
    "src/trainplan/__init__.py": "def __getattr__(name):\n    if name == 'late':\n"
                                 "        from trainplan.lazy import late\n        return late\n",
    "src/trainplan/lazy.py": "late = 1\n",
    "src/trainplan/a/__init__.py": "from .b import B\n",
    "src/trainplan/a/b.py": "def f():\n    from ..c import g  # inside a function: runs when f does\n    B = 1\n",
    "src/trainplan/c.py": "import json\ng = 1\nZOO = 'trainplan.zoo:net'\n",
    "src/trainplan/zoo.py": "net = 1\n",
    "src/trainplan/d.py": "unused = 1\n",
    "src/trainplan/a/table.json": "{}",
    "workflow/scripts/one.py": "from trainplan.a import B\n",
    "workflow/scripts/two.py": "from trainplan import late\n",
}


def test_closure_follows_relative_function_level_lazy_and_named_imports(tmp_path):
    root = _tree(tmp_path, PACKAGE)
    one = closure(root, "workflow/scripts/one.py")
    assert one.modules == {"trainplan", "trainplan.a", "trainplan.a.b", "trainplan.c", "trainplan.zoo"}
    assert "src/trainplan/a/table.json" in one.files and "workflow/scripts/one.py" in one.files
    assert "src/trainplan/lazy.py" not in one.files and "src/trainplan/d.py" not in one.files
    two = closure(root, "workflow/scripts/two.py")  # the lazy name brings its module, and only it
    assert two.modules == {"trainplan", "trainplan.lazy"}
    assert closure(root, "workflow/scripts/two.py", "trainplan.d").modules == {"trainplan", "trainplan.lazy",
                                                                                "trainplan.d"}


def test_digest_is_the_same_in_any_clone_and_moves_only_with_the_closure(tmp_path):
    first, second = _tree(tmp_path / "x", PACKAGE), _tree(tmp_path / "elsewhere" / "y", PACKAGE)
    files = closure(first, "workflow/scripts/one.py").files
    before = digest(first, files)
    assert digest(second, closure(second, "workflow/scripts/one.py").files) == before
    (second / "src/trainplan/d.py").write_text("unused = 2\n")  # outside the closure
    assert digest(second, closure(second, "workflow/scripts/one.py").files) == before
    (second / "src/trainplan/c.py").write_text("g = 2\n")  # deep inside: reached through a function's import
    assert digest(second, closure(second, "workflow/scripts/one.py").files) != before


def test_an_unparsable_module_is_named(tmp_path):
    root = _tree(tmp_path, {**PACKAGE, "src/trainplan/c.py": "def (:\n"})
    with pytest.raises(CodeError, match=r"src/trainplan/c\.py: cannot parse"):
        closure(root, "workflow/scripts/one.py")
    with pytest.raises(CodeError, match="no such script"):
        closure(root, "workflow/scripts/three.py")


class _PackageFinder(modulefinder.ModuleFinder):
    """The standard library's ModuleFinder (it reads bytecode, not the syntax tree), following trainplan only."""

    def import_hook(self, name, caller=None, fromlist=None, level=-1):  # noqa: D102 (ModuleFinder's own hook)
        package = caller.__name__ if caller is not None and caller.__name__ != "__main__" else ""
        if level == 0 and name.partition(".")[0] != "trainplan" or level > 0 and not package:
            return None
        return super().import_hook(name, caller, fromlist, level)


def test_closure_is_within_what_an_independent_finder_sees():
    """ModuleFinder follows every import it sees in the bytecode, lazy ones included: the closure (which leaves a
    package's ``__getattr__`` imports to the names that use them) is within it. ModuleFinder does not see modules
    named in strings (``python -m trainplan.layout.sweep_worker`` in a subprocess): it is given those."""
    named = {name for path in (REPO / "src").rglob("*.py")
             for name in re.findall(r"[\"'](trainplan(?:\.\w+)+)(?::\w+)?[\"']", path.read_text())}
    assert "trainplan.layout.sweep_worker" in named
    for script in SCRIPTS:
        finder = _PackageFinder(path=[str(REPO / "src")])
        finder.run_script(str(script))
        for name in named & closure(REPO, f"workflow/scripts/{script.name}").modules:
            finder.import_hook(name)
        seen = {name for name in finder.modules if name.partition(".")[0] == "trainplan"}
        found = closure(REPO, f"workflow/scripts/{script.name}").modules
        assert found <= seen, (script.name, found - seen)


def test_every_rule_versions_the_script_it_runs():
    rules = [(path.name, name, body) for path in sorted((REPO / "workflow" / "rules").glob("*.smk"))
             for name, body in RULE.findall(path.read_text())]
    assert len(rules) >= 30
    for smk, name, body in rules:
        script = re.search(r'script:\s*"\.\./scripts/(\w+)\.py"', body)
        if script is None:
            continue
        assert f'code=code_version("{script.group(1)}")' in body, f"{smk}: rule {name}"


def _scratch_repo(dest: Path) -> Path:
    """A copy of the checkout's tracked files (no venv, no results) at ``dest``."""
    names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout
    for name in filter(None, names.decode().split("\0")):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def _summary(repo: Path, study: Path) -> list[dict[str, str]]:
    """``snakemake --summary`` of the tiny study in ``study`` with ``repo``'s Snakefile and package: a row per
    output file (rule, status: why its own job is stale, plan: whether it would be updated). The set of input
    files is left out of the triggers: the study records the config-named files it found in the repository
    (common.smk's study_file) by their absolute path, which differs in the scratch clone."""
    cmd = [sys.executable, "-m", "snakemake", "--summary", "--snakefile", str(repo / "Snakefile"), "--directory",
           str(study), "--cores", "2", "--configfile", str(TINY), "--rerun-triggers", "mtime", "params", "code",
           "software-env"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=repo,
                         env={**os.environ, "PYTHONPATH": str(repo / "src")})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split("\t") for line in out.stdout.splitlines() if line.count("\t") == 5]
    return [dict(zip(lines[0], line)) for line in lines[1:]]


def _params_changed(rows: list[dict[str, str]]) -> set[str]:
    """Rules with an output whose own job's params changed (upstream jobs aside)."""
    return {row["rule"] for row in rows if row["status"] == "params changed"}


@pytest.mark.workflow
def test_editing_a_module_reruns_exactly_the_rules_that_run_it(tiny_study, tmp_path):
    """In a scratch clone: nothing to do at first (the versions do not depend on where the checkout is); after a
    comment is appended to a module deep in the scheduler, the rules whose params changed are exactly those
    whose scripts' closures hold it; a module no rule runs changes nothing."""
    repo = _scratch_repo(tmp_path / "repo")
    study = copy_of_study(tiny_study, tmp_path / "study")
    rows = _summary(repo, study)
    assert len(rows) > 50 and {row["plan"] for row in rows} == {"no update"}
    in_study = {row["rule"] for row in rows}

    module = "src/trainplan/schedule/problem.py"
    smk = "\n".join(path.read_text() for path in (repo / "workflow/rules").glob("*.smk"))
    expected = {name for name, body in RULE.findall(smk)
                if (script := re.search(r'"\.\./scripts/(\w+)\.py"', body))
                and module in closure(repo, f"workflow/scripts/{script.group(1)}.py").files}
    assert {"schedule", "balance", "validate"} <= expected and "export" not in expected
    with open(repo / module, "a") as handle:
        handle.write("# an edit\n")
    assert _params_changed(_summary(repo, study)) == expected & in_study

    (repo / module).write_bytes((REPO / module).read_bytes())
    cli = "src/trainplan/cli.py"  # the command line: no rule runs it
    assert not any(cli in closure(repo, f"workflow/scripts/{script.name}").files for script in SCRIPTS)
    with open(repo / cli, "a") as handle:
        handle.write("# an edit\n")
    assert {row["plan"] for row in _summary(repo, study)} == {"no update"}
