"""Train a model for N optimizer steps under a recompute/swap plan, beside the same training without one.

    python examples/train_under_plan.py --model tiny_gpt2 --steps 5

Without ``--plan``, the step is traced, profiled and planned here (one stage, at ``--fraction`` of its
no-recompute activation peak) and the plan is written to ``--out``; with ``--plan DIR`` a plan from the
workflow (``results/balance/<model>/cpu/k1/b<f>/``) is used. Each step logs the planned and unplanned loss,
whether they are bit-identical, and each run's measured peak (the step's inputs plus the most the allocator
held on top of them) against the plan's budget.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

import trainplan
from trainplan.execute import build_plan
from trainplan.execute.measure import peak_during
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.io import write_json
from trainplan.models import build_model
from trainplan.profile.link import measure_host_link
from trainplan.profile.op_times import profile_nodes

MODELS = {  # the tiny study's models (tests/config/config.yaml)
    "tiny_gpt2": {"architecture": "GPT2LMHeadModel",
                  "config": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 64},
                  "inputs": {"batch_size": 2, "seq_len": 16}},
    "small_cnn": {"source": "callable", "callable": "trainplan.zoo:small_cnn"},
}
KIB = 2**10


def make_plan(name: str, fraction: float, out: Path, seed: int) -> None:
    """Trace, profile and schedule the model's step at ``fraction``; write ``out/plan.json``."""
    built = build_model(name, MODELS[name], seed=seed)
    traced, flat = trace_training_step(built)
    tables = graph_tables(traced)
    times = profile_nodes(traced, flat, tables.nodes, repeats=3, warmup=1, progress=False).ops[["name", "time_s"]]
    nodes = tables.nodes.merge(times, on="name", validate="one_to_one")
    link = measure_host_link(torch.device("cpu"), tables.nodes.alloc_bytes.tolist())
    plan = build_plan(nodes, tables.tensors, [nodes.name.tolist()], model=name, device="cpu", fraction=fraction,
                      bandwidth=link.bytes_per_s, seed=seed)
    write_json(out / "plan.json", plan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny_gpt2")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=0.5, help="budget: this fraction of the no-recompute peak")
    parser.add_argument("--plan", type=Path, help="a plan directory from the workflow (default: plan here)")
    parser.add_argument("--out", type=Path, default=Path("results/example"), help="where a plan made here goes")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    if args.plan is None:
        args.plan = args.out / args.model
        make_plan(args.model, args.fraction, args.plan, args.seed)
    built = build_model(args.model, MODELS[args.model], seed=args.seed)
    model, batch = built.module, built.batch
    step = trainplan.load_step(args.plan, model, batch)
    print(f"plan {args.plan}: budget {step.budget_bytes[0] / KIB:.1f} KiB, predicted peak "
          f"{step.predicted_peak_bytes[0] / KIB:.1f} KiB")

    reference = copy.deepcopy(model)  # the same model trained without a plan, on the same traced graph
    unplanned = step.traced.gm
    optimizers = [torch.optim.AdamW(m.parameters(), lr=args.lr) for m in (model, reference)]
    buffers = [t.detach() for t in reference.buffers()]
    cpu = torch.device("cpu")
    for i in range(args.steps):
        params = dict(model.named_parameters())
        start = sum(t.untyped_storage().nbytes() for t in step.flat(params, batch))
        (loss, grads), peak = peak_during(lambda: step(params, batch), cpu)
        ref_params = [p.detach() for p in reference.parameters()]
        with torch.no_grad():
            (ref_loss, *ref_grads), ref_peak = peak_during(
                lambda: unplanned(*ref_params, *buffers, *[batch[n] for n in step.traced.batch_names]), cpu)
        same = torch.equal(loss, ref_loss) and all(torch.equal(grads[n], g) for n, g
                                                  in zip(step.traced.param_names, ref_grads))
        print(f"step {i}: loss {loss.item():.6f} (unplanned {ref_loss.item():.6f}, bit-identical {same}); "
              f"peak {(start + peak) / KIB:.1f} KiB (unplanned {(start + ref_peak) / KIB:.1f} KiB, "
              f"budget {step.budget_bytes[0] / KIB:.1f} KiB)")
        for m, g, opt in ((model, [grads[n] for n, _ in model.named_parameters()], optimizers[0]),
                          (reference, ref_grads, optimizers[1])):
            for p, gp in zip(m.parameters(), g):
                p.grad = gp
            opt.step()
            opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
