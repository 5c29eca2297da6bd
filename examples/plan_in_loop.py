"""Train GPT-2 under a byte budget at half of eager training's measured peak, in a plain PyTorch loop:
``trainplan.plan`` wraps the model once (the optimizer's updates in the plan), the loop stays as it is.

    python examples/plan_in_loop.py                  # GPT-2 small, batch 2 x 128 (the default study's shape)
    python examples/plan_in_loop.py --tiny --steps 3 # a 2-layer GPT-2 on short sequences

It first trains a copy of the model eagerly for two steps and measures the second step's peak above what the
process held before it (the parameters, the batch and AdamW's state): one meter for both, the process's
resident memory (``trainplan.execute.measure.process_peak_during``). The budget is the plan's fixed bytes (those
same tensors) plus ``--share`` of that peak. Each planned step then prints its loss and measured peak (the
first one's includes making AdamW's state, which the plan counts as held throughout). ``--loss-chunk 16MiB``
runs the loss head as one op over chunks of the logits (docs/plan_api.md, "The chunked loss head").
The first run profiles and solves the step (a few minutes for GPT-2 small on a CPU); later runs read the plan
from the cache (``~/.cache/trainplan/plans``, or ``$TRAINPLAN_PLAN_CACHE``) in seconds.
"""

from __future__ import annotations

import argparse
import copy

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import trainplan
from trainplan.budget import format_bytes
from trainplan.execute.measure import process_peak_during
from trainplan.loop.updates import state_bytes
from trainplan.timing import return_freed_memory


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def eager_budget(model: torch.nn.Module, batch: dict[str, torch.Tensor], share: float) -> tuple[int, int]:
    """The plan's fixed bytes (parameters, batch, AdamW's state) + ``share`` x the measured peak of an eager step
    of a copy of ``model`` (the second of two, AdamW's state made by the first); and that peak."""
    eager = copy.deepcopy(model)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-4)

    def eager_step() -> None:
        eager(**batch).loss.backward()
        eager_opt.step()
        eager_opt.zero_grad()

    process_peak_during(eager_step)
    _, peak = process_peak_during(eager_step)
    fixed = tensor_bytes(model.parameters()) + tensor_bytes(batch.values()) + state_bytes(eager_opt)
    budget = int(fixed + share * peak)
    print(f"eager step: {format_bytes(peak)} above the parameters, batch and optimizer state ({format_bytes(fixed)}); "
          f"budget {format_bytes(budget)} = those + {share:g} x the eager peak")
    return budget, peak


def options(description: str) -> argparse.Namespace:
    """The examples' command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--share", type=float, default=0.5, help="of eager's measured peak above the inputs")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer GPT-2, batch 2 x 16")
    parser.add_argument("--budget", help="bytes ('2GiB') or a fraction of the no-recompute peak, instead of --share")
    parser.add_argument("--time-limit", type=float, default=60.0, help="the solver's, in seconds")
    parser.add_argument("--loss-chunk", help="bytes ('16MiB'): the loss head as one op over logits chunks of at most "
                        "this (default: as traced)")
    return parser.parse_args()


def gpt2(tiny: bool) -> tuple[GPT2LMHeadModel, int, int]:
    """GPT-2 small (batch 2 x 128, the default study's shape) or a 2-layer one (2 x 16), seed 0; batch shape."""
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64) if tiny else GPT2Config()
    config.use_cache = False  # a KV cache is appended to again when a block is recomputed
    return GPT2LMHeadModel(config), 2, 16 if tiny else 128


def main() -> None:
    args = options(__doc__.splitlines()[0])
    return_freed_memory()  # the meter reads live bytes
    model, batch_size, seq_len = gpt2(args.tiny)
    config = model.config
    gen = torch.Generator().manual_seed(1)

    def next_batch() -> dict[str, torch.Tensor]:  # stands in for a data loader
        ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=gen)
        return {"input_ids": ids, "labels": ids}

    batch = next_batch()
    budget, eager_peak = (args.budget, None) if args.budget else eager_budget(model, batch, args.share)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    planned = trainplan.plan(model, batch, budget, optimizer=optimizer, time_limit_s=args.time_limit,
                             loss_chunk=args.loss_chunk)
    print(planned.report)
    for step in range(args.steps):
        batch = next_batch()

        def train_step() -> float:
            loss = planned(batch)   # forward, backward and each parameter's AdamW update, as planned
            loss.backward()         # nothing left: the gradients were applied and freed in the step
            optimizer.step()        # finds no gradient: does nothing
            optimizer.zero_grad()
            return loss.item()

        held = tensor_bytes(model.parameters()) + tensor_bytes(batch.values()) + state_bytes(optimizer)
        loss, peak = process_peak_during(train_step)
        versus = f"{peak / eager_peak:.2f} x eager's; " if eager_peak else ""
        print(f"step {step}: loss {loss:.4f}, measured peak {format_bytes(peak)} above the inputs ({versus}with them "
              f"{format_bytes(held + peak)}, budget {format_bytes(planned.report.planned_budget_bytes)})")


if __name__ == "__main__":
    main()
