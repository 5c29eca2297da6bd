"""A conv that PyTorch 2.13's CPU backward crashes on in channels_last (1x1, stride 2, 3 input channels, 64 px):
the layout stage measures, plans and executes the model without ever running that conv in NHWC in its own
process. Each check runs in a subprocess, so a regression shows as a failed test, not a crashed test run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

MODEL = """
import json
import torch
from torch import nn

class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 1, stride=2, bias=False)  # the shape torch 2.13 crashes on in NHWC
        self.body = nn.Sequential(nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))
        self.head = nn.Linear(16, 4)

    def forward(self, x, labels):
        return nn.functional.cross_entropy(self.head(self.body(self.stem(x)).mean(dim=(2, 3))), labels)

torch.manual_seed(0)
module = Stem()
batch = {"x": torch.randn(2, 3, 64, 64), "labels": torch.tensor([0, 3])}
"""


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(MODEL) + textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=600, check=False)


def test_the_stem_crashes_torch_when_run_in_nhwc_in_a_fresh_process():
    """Why the guard exists (with nothing run before it; after other work the process sometimes survives, which
    is why the guard knows the shape instead of relying on a probe). If a torch release fixes this, the test
    fails, and ``measure.known_crash`` can go."""
    script = """
        import torch
        x = torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
        w = torch.randn(16, 3, 1, 1).contiguous(memory_format=torch.channels_last).requires_grad_()
        for _ in range(3):
            torch.nn.functional.conv2d(x, w, stride=2).sum().backward()
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode != 0  # SIGSEGV or a heap-corruption abort


def test_measure_plan_and_execute_leave_that_conv_in_nchw():
    out = run("""
        from trainplan.layout.build import build_problem
        from trainplan.layout.execute import apply_layouts, train_step
        from trainplan.layout.graph import trace_conv_graph
        from trainplan.layout.measure import Timing, measure_graph
        from trainplan.layout.solve import solve_all
        graph = trace_conv_graph("stem", module, batch)
        tables = measure_graph(graph, ["nchw", "nhwc"], Timing(repeats=1, warmup=0))
        convs = tables["convs"].set_index("conv")
        problem = build_problem("stem", tables["convs"], tables["groups"], tables["edges"], ["nchw", "nhwc"])
        plan = solve_all(problem, 5.0, 1, 0)
        plans = {"planned": plan.layouts, **{k: v["layouts"] for k, v in plan.extra["baselines"].items()}}
        for name, lay in plans.items():  # every plan and baseline runs a training step in this process
            train_step(apply_layouts(module, lay, name).module, batch, lambda loss: loss)
        print(json.dumps({"error": convs.loc["stem", "error"], "body_error": convs.loc["body.2", "error"],
                          "stem_nhwc": [float(convs.loc["stem", "fwd_nhwc"]), float(convs.loc["stem", "bwd_nhwc"])],
                          "body_nhwc": float(convs.loc["body.2", "fwd_nhwc"]),
                          "allowed": problem.allowed("stem"), "body_allowed": problem.allowed("body.2"),
                          "stem_layouts": {k: v["stem"] for k, v in plans.items()},
                          "body_layouts": {k: v["body.2"] for k, v in plans.items()}}))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["error"].startswith("nhwc: known PyTorch crash"), found
    assert found["body_error"] == "" and found["body_nhwc"] > 0
    assert all(v != v for v in found["stem_nhwc"])  # NaN: never timed in NHWC
    assert list(found["allowed"]) == ["nchw"] and set(found["body_allowed"]) == {"nchw", "nhwc"}
    assert set(found["stem_layouts"].values()) == {"nchw"}  # all_nhwc and best_single included
    assert found["body_layouts"]["all_nhwc"] == "nhwc"
