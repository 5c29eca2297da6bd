"""Code versions of the workflow's rules: every source file a rule's script runs, found by following its imports.

A rule's script imports ``trainplan`` modules, which import others, at module level or inside functions. The
closure of those imports, read from the source files of the checkout (not the installed package), is what the
rule's result depends on; its digest, a ``params`` value of the rule, makes Snakemake rerun the rule whenever one
of those files changes, and only then. The digest covers each file's path relative to the repository and its
bytes, so it is the same for the same commit in any clone or unpacked archive. Standard library only: the
Snakefile loads it before anything else.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PACKAGE = "trainplan"
#: files a package reads beside its modules (the JSON schemas of ``trainplan.schemas``): part of its code
DATA_SUFFIXES = (".json", ".yaml", ".yml")
#: a string naming a module of the package, as a model's ``callable`` does ("trainplan.zoo:small_cnn")
_MODULE_REF = re.compile(rf"{PACKAGE}(?:\.\w+)+(?::\w+)?")


class CodeError(Exception):
    """A script or module of the closure cannot be read or parsed."""


@dataclass(frozen=True)
class Closure:
    """The package modules a script runs (dotted names) and every file of its code (paths relative to the
    repository: the script, the modules, the data files beside them)."""

    modules: frozenset[str]
    files: tuple[str, ...]


def _module_file(src: Path, name: str) -> Path | None:
    """Source file of the dotted module ``name`` under ``src``: a package's ``__init__.py`` or a ``.py`` file."""
    base = src.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _absolute(node: ast.ImportFrom, module: str | None, is_package: bool) -> str:
    """The absolute module an ``from ... import`` statement names (its relative dots resolved)."""
    if not node.level:
        return node.module or ""
    if module is None:
        raise CodeError(f"relative import 'from {'.' * node.level}{node.module or ''}' outside a package")
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    return ".".join(parts[:keep] + ([node.module] if node.module else []))


@dataclass(frozen=True)
class Imports:
    """What one source file imports: ``names`` when it runs; ``lazy``: for each name a module-level
    ``__getattr__`` hands out on first use (PEP 562), the modules it imports then; ``named``: package modules
    its strings name (``"trainplan.zoo:small_cnn"``, ``python -m trainplan.layout.sweep_worker``), which it
    runs by name or in another process."""

    names: frozenset[str]
    lazy: dict[str, frozenset[str]]
    named: frozenset[str]


def imports(path: Path, module: str | None) -> Imports:
    """The imports of a source file anywhere in its body (inside functions too), relative imports resolved:
    for ``from m import x`` both ``m`` and ``m.x`` (x may be a submodule). ``module``: the file's own dotted
    name (None for a script)."""
    stat = path.stat()
    return _parsed(path, module, stat.st_mtime_ns, stat.st_size)


def _import_names(node: ast.AST, module: str | None, is_package: bool) -> dict[str, str]:
    """Bound name -> dotted name it may import, for one import statement (empty for any other node)."""
    if isinstance(node, ast.Import):
        return {alias.asname or alias.name: alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom):
        base = _absolute(node, module, is_package)
        return {"": base} | {alias.asname or alias.name: f"{base}.{alias.name}" for alias in node.names
                             if alias.name != "*"}
    return {}


@cache
def _parsed(path: Path, module: str | None, mtime_ns: int, size: int) -> Imports:
    """imports() of one version of the file (keyed by its time and size: an edited file is read again)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise CodeError(f"{path}: cannot parse: {exc}") from exc
    is_package = path.name == "__init__.py"
    lazy_defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
    lazy: dict[str, set[str]] = {}
    for node in (inner for getattr_def in lazy_defs for inner in ast.walk(getattr_def)):
        for bound, name in _import_names(node, module, is_package).items():
            lazy.setdefault(bound, set()).add(name)
    names: set[str] = set()
    named: set[str] = set()
    todo: list[ast.AST] = [node for node in tree.body if not any(node is d for d in lazy_defs)]
    while todo:  # one walk for both (ast.walk per question was most of a Snakefile parse's time)
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(_import_names(node, module, is_package).values())
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str) and _MODULE_REF.fullmatch(node.value):
                named.add(node.value.partition(":")[0])
        else:
            todo.extend(ast.iter_child_nodes(node))
    return Imports(frozenset(names), {bound: frozenset(found) for bound, found in lazy.items() if bound},
                   frozenset(named))


def _prefixes(name: str) -> list[str]:
    """``a``, ``a.b``, ``a.b.c`` for ``a.b.c``: importing a module runs its parents' ``__init__`` first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def closure(root: Path, script: str, *extra: str) -> Closure:
    """Every package module that ``script`` (a path relative to ``root``, the repository) runs, found in
    ``root/src``, with the modules named in ``extra`` (e.g. a model's callable) and their own imports."""
    src = root / "src"
    path = root / script
    if not path.is_file():
        raise CodeError(f"{path}: no such script")
    modules: dict[str, Path] = {}
    script_imports = imports(path, None)
    todo = [*script_imports.names, *script_imports.named, *extra]
    done: set[str] = set()  # names followed already (many modules import the same names)
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        parent = None
        for prefix in _prefixes(name):
            if prefix.partition(".")[0] != PACKAGE:
                break
            if prefix not in modules:
                found = _module_file(src, prefix)
                if found is None:  # an attribute: a lazy one of its module's __getattr__ imports its modules
                    if parent is not None:
                        todo.extend(imports(modules[parent], parent).lazy.get(prefix.rpartition(".")[2], ()))
                    break
                modules[prefix] = found
                found_imports = imports(found, prefix)
                todo.extend([*found_imports.names, *found_imports.named])
            parent = prefix
    files = {path, *modules.values()}
    for folder in {p.parent for p in modules.values()}:
        files.update(p for p in folder.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file())
    return Closure(frozenset(modules), tuple(sorted(p.relative_to(root).as_posix() for p in files)))


def digest(root: Path, files: tuple[str, ...]) -> str:
    """Short sha256 of the files' repository paths and bytes (their order as given)."""
    sha = hashlib.sha256()
    for name in files:
        data = (root / name).read_bytes()
        sha.update(f"{name}\0{len(data)}\0".encode())
        sha.update(data)
    return sha.hexdigest()[:16]
