"""Train GPT-2 with Hugging Face's Trainer under a byte budget at half of eager training's measured peak: the
planned module is the Trainer's model, the optimizer runs in the plan, a callback logs each step's measured peak.

    python examples/plan_with_trainer.py                  # GPT-2 small, batch 2 x 128
    python examples/plan_with_trainer.py --tiny --steps 3 # a 2-layer GPT-2 on short sequences

The budget is found as in examples/plan_in_loop.py (two eager steps of a copy, the second one measured), or
given with ``--budget``.
Trainer is told what an optimizer in the step requires (docs/plan_api.md): the optimizer handed to it,
no gradient clipping (``max_grad_norm=0``), no gradient accumulation.
"""

from __future__ import annotations

import tempfile

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import trainplan
from plan_in_loop import eager_budget, gpt2, options  # this folder's other example
from trainplan.budget import format_bytes
from trainplan.execute.measure import HighWaterMark
from trainplan.timing import return_freed_memory


class PeakPerStep(TrainerCallback):
    """Logs each training step's measured peak above what the process held before it."""

    def __init__(self) -> None:
        self.mark = HighWaterMark()

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 (Trainer's signature)
        self.mark.start()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        print(f"step {state.global_step}: measured peak {format_bytes(self.mark.read())} above the inputs")


def main() -> None:
    args = options(__doc__.splitlines()[0])
    return_freed_memory()
    model, batch_size, seq_len = gpt2(args.tiny)
    config = model.config
    gen = torch.Generator().manual_seed(1)
    rows = [{"input_ids": ids, "labels": ids} for ids in
            torch.randint(0, config.vocab_size, (batch_size * args.steps, seq_len), generator=gen)]
    batch = {k: torch.stack([r[k] for r in rows[:batch_size]]) for k in ("input_ids", "labels")}

    budget = args.budget or eager_budget(model, batch, args.share)[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    planned = trainplan.plan(model, batch, budget, optimizer=optimizer, time_limit_s=args.time_limit,
                             loss_chunk=args.loss_chunk)
    print(planned.report)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(
            model=planned, train_dataset=rows, optimizers=(optimizer, None), callbacks=[PeakPerStep()],
            args=TrainingArguments(out, max_steps=args.steps, per_device_train_batch_size=batch_size, use_cpu=True,
                                   max_grad_norm=0, gradient_accumulation_steps=1, logging_steps=1, report_to=[],
                                   save_strategy="no", dataloader_drop_last=True))
        trainer.train()


if __name__ == "__main__":
    main()
