"""No function of the scheduler (``src/trainplan/schedule/``) takes more than MAX_PARAMETERS parameters, ``self`` and
``cls`` not counted (issue 50): related arguments travel together in small frozen dataclasses (``mip.CpSatRun``,
``dtr.DtrOptions``, ``solve.SolveOptions``...)."""

import ast
from pathlib import Path

import trainplan.schedule

MAX_PARAMETERS = 6
SCHEDULE = Path(trainplan.schedule.__file__).parent


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The names of ``fn``'s parameters, ``*args`` and ``**kwargs`` included, its leading ``self`` or ``cls`` not."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [f"*{a.vararg.arg}"] if a.vararg else []
    names += [f"**{a.kwarg.arg}"] if a.kwarg else []
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def test_no_scheduler_function_takes_more_than_six_parameters():
    functions, over = 0, []
    for path in sorted(SCHEDULE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions += 1
                if len(parameters(node)) > MAX_PARAMETERS:
                    over.append(f"{path.name}:{node.lineno} {node.name}({', '.join(parameters(node))})")
    assert functions > 300  # the scheduler's modules were read
    assert not over, "\n".join(over)
