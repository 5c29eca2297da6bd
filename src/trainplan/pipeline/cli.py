"""``trainplan pipeline-run PLAN_DIR --config CONFIG``: run a k-stage plan as k processes (torchrun), one stage
each (or as k / v, v stages each, under Interleaved1F1B), and write the measurements beside the balance rule's
prediction (docs/pipeline_run.md).

Outside torchrun the command checks its input and launches ``torchrun --standalone --nproc-per-node k/v`` running
:mod:`~trainplan.pipeline.worker` (:mod:`~trainplan.pipeline.launch`); under torchrun (``WORLD_SIZE`` set) it is one
rank of the pipeline.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from trainplan.cli_types import nonnegative_int, positive_int


def add_parser(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """Register the ``pipeline-run`` subcommand; returns its runner."""
    ap = sub.add_parser("pipeline-run", help="run a k-stage plan as a real pipeline (torchrun, GPipe, 1F1B or "
                                             "Interleaved1F1B)")
    ap.add_argument("plan", help="PLAN_DIR: a balance output directory holding plan.json (or the file)")
    ap.add_argument("--config", required=True, help="config YAML whose 'models' entry builds the plan's model")
    ap.add_argument("--model", default=None, help="model name in the config (default: the plan's 'model')")
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved1f1b"], default="1f1b")
    ap.add_argument("--stages-per-rank", type=positive_int, default=None,
                    help="interleaved1f1b: v stages per rank, stage s on rank s mod k/v (default 2); the other "
                         "schedules run one")
    ap.add_argument("-m", "--micro-batches", type=positive_int, default=4,
                    help="micro-batches per step, each the batch the plan was traced with")
    ap.add_argument("-o", "--output", default=None,
                    help="artifact JSON (default: PLAN_DIR/pipeline_run_<schedule>_m<M>.json)")
    ap.add_argument("--check", action="store_true",
                    help="compare each rank's gradients and the losses with the single-process planned step "
                         "(bit for bit; tied parameters reduced once per step within round-off) and eager autograd "
                         "(every rank then runs the whole step)")
    ap.add_argument("--tied-grads", choices=["step", "micro-batch"], default="step",
                    help="a weight read by two stages (GPT-2's embedding): its partial gradient summed over the "
                         "micro-batches and sent once per step (default), or sent in every micro-batch's carrier "
                         "(bit-identical to the single-process step, and as many bytes forward as back)")
    ap.add_argument("--warmup", type=nonnegative_int, default=1, help="steps run before the measured ones")
    ap.add_argument("--repeats", type=positive_int, default=1, help="measured steps (medians over them)")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads per rank")
    ap.add_argument("--seed", type=nonnegative_int, default=None, help="model seed (default: the config's, or 0)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one GPU per rank, NCCL")
    return run


def _settings(args: argparse.Namespace):  # -> RunSettings (imported late: torch)
    from trainplan.errors import ArtifactError
    from trainplan.execute.plan import load_plan
    from trainplan.execute.step import plan_file
    from trainplan.io import read_yaml
    from trainplan.pipeline.errors import PipelineError
    from trainplan.pipeline.run import RunSettings

    if not Path(args.plan).exists():
        raise PipelineError(f"{args.plan}: no such directory or file (PLAN_DIR: a balance output directory "
                            "holding plan.json)")
    data, _ = load_plan(plan_file(args.plan))
    config = read_yaml(args.config, what="config")
    name = args.model or str(data.get("model", ""))
    models = config.get("models") if isinstance(config, dict) else None
    if not isinstance(models, dict) or name not in models:
        known = sorted(models) if isinstance(models, dict) else []
        raise ArtifactError(f"config {args.config}: no model '{name}' under 'models' (has {known})")
    seed = args.seed if args.seed is not None else int(config.get("seed", 0))
    v = args.stages_per_rank if args.stages_per_rank is not None else 2 if args.schedule == "interleaved1f1b" else 1
    return data, RunSettings(Path(args.plan), name, dict(models[name]), args.schedule, args.micro_batches,
                             Path(args.output) if args.output else None, seed, args.warmup, args.threads,
                             args.check, args.device, args.repeats, args.tied_grads.replace("-", "_"), v)


def run(args: argparse.Namespace) -> int:
    """Under torchrun: this rank's part. Otherwise: check the input, then launch one rank per stage."""
    from trainplan.pipeline.launch import launch
    from trainplan.pipeline.run import check_settings, run_pipeline
    from trainplan.pipeline.worker import summary_line

    data, settings = _settings(args)
    if "WORLD_SIZE" in os.environ:
        out = run_pipeline(settings)
        if out is not None:
            print(summary_line(settings, out))
        return 0
    check_settings(settings, data, None)
    code = launch(settings, settings.ranks(len(data["stages"])))
    if code != 0:
        print(f"trainplan pipeline-run: error: a rank failed (exit {code}); its message is above", file=sys.stderr)
    return code
