"""Train GPT-2 under a memory budget in a plain PyTorch loop: ``trainplan.plan`` wraps the model once, the loop
stays as it is.

    python examples/plan_in_loop.py --budget 0.5 --steps 10    # GPT-2 small, batch 4 x 256
    python examples/plan_in_loop.py --tiny --steps 3           # a 2-layer GPT-2 on short sequences

The first run traces, profiles and solves the step (a minute for GPT-2 small on a CPU); later runs read the plan
from the cache (``~/.cache/trainplan/plans``, or ``$TRAINPLAN_PLAN_CACHE``) in seconds.
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import trainplan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="0.6", help="bytes ('2GiB') or a fraction of the step's no-recompute peak")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer GPT-2, batch 4 x 32")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.tiny:
        config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64)
        batch_size, seq_len = 4, 32
    else:
        config = GPT2Config()
        batch_size, seq_len = 4, 256
    config.use_cache = False  # a KV cache is appended to again when a block is recomputed
    model = GPT2LMHeadModel(config)

    def next_batch() -> dict[str, torch.Tensor]:  # stands in for a data loader
        ids = torch.randint(0, config.vocab_size, (batch_size, seq_len))
        return {"input_ids": ids, "labels": ids}

    planned = trainplan.plan(model, next_batch(), args.budget)
    print(planned.report)
    optimizer = torch.optim.AdamW(planned.parameters(), lr=1e-3)
    for step in range(args.steps):
        loss = planned(next_batch())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
