"""A large parameter's in-plan update in row chunks (``loop.updates``): the same parameter values and optimizer
state as the whole update, bit for bit, for every elementwise optimizer, and chunk-sized temporaries."""

from __future__ import annotations

import pytest
import torch

from trainplan.execute.measure import peak_during
from trainplan.loop import updates
from trainplan.loop.updates import ParamUpdates, chunk_rows

OPTIMIZERS = [
    (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True}),
    (torch.optim.Adam, {"lr": 1e-2}),
    (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
    (torch.optim.RMSprop, {"lr": 1e-3, "momentum": 0.5, "centered": True}),
    (torch.optim.Adagrad, {"lr": 1e-2}),
    (torch.optim.NAdam, {"lr": 1e-2}),
    (torch.optim.RAdam, {"lr": 1e-2}),
    (torch.optim.Adamax, {"lr": 1e-2}),
]


def _three_steps(cls, options, chunk_bytes, monkeypatch) -> tuple[list[torch.Tensor], dict]:
    """A 37 x 12 weight and a bias, three updates of each from the same gradients."""
    monkeypatch.setattr(updates, "CHUNK_BYTES", chunk_bytes)
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(37, 12, generator=gen)),
              torch.nn.Parameter(torch.randn(12, generator=gen))]
    opt = cls(params, **options)
    step = ParamUpdates(opt, params, ["w", "b"])
    for _ in range(3):
        for i, p in enumerate(params):
            step(i, torch.randn(p.shape, generator=gen))
    return [p.detach().clone() for p in params], opt.state_dict()


@pytest.mark.parametrize(("cls", "options"), OPTIMIZERS, ids=[c.__name__ for c, _ in OPTIMIZERS])
def test_chunked_updates_give_the_whole_updates_values_and_state(cls, options, monkeypatch):
    """Chunks of 5 rows (the weight: 8 chunks, the last of 2 rows; the bias whole): parameters and every state
    entry equal to the whole update's (the step count once, not once per chunk)."""
    assert chunk_rows(cls([torch.nn.Parameter(torch.zeros(37, 12))]), torch.zeros(37, 12)) is None  # 1.7 KiB: whole
    whole, whole_state = _three_steps(cls, options, 2**30, monkeypatch)
    chunked, chunked_state = _three_steps(cls, options, 5 * 12 * 4, monkeypatch)
    for a, b in zip(whole, chunked):
        assert torch.equal(a, b)
    assert whole_state["param_groups"] == chunked_state["param_groups"]
    assert whole_state["state"].keys() == chunked_state["state"].keys() == {0, 1}
    for i in (0, 1):
        mine, theirs = chunked_state["state"][i], whole_state["state"][i]
        assert mine.keys() == theirs.keys()
        for k, v in theirs.items():
            assert torch.equal(mine[k], v) if isinstance(v, torch.Tensor) else mine[k] == v, (cls.__name__, i, k)


def test_a_chunked_adamw_update_holds_chunk_sized_temporaries_and_others_stay_whole(monkeypatch):
    """A 1024 x 256 weight (1 MiB) with AdamW: whole, its update allocates two weight-sized temporaries; in 64 KiB
    chunks at most two chunks' more. An optimizer outside ELEMENTWISE (a subclass) is stepped whole."""
    weight = torch.nn.Parameter(torch.randn(1024, 256))
    opt = torch.optim.AdamW([weight], lr=1e-3)
    step = ParamUpdates(opt, [weight], ["w"])
    size = weight.numel() * 4
    peaks = {}
    for chunk in (2**30, 2**16):
        monkeypatch.setattr(updates, "CHUNK_BYTES", chunk)
        step(0, torch.randn_like(weight))  # the state exists from the first step on
        grad = torch.randn_like(weight)
        _, peaks[chunk] = peak_during(lambda: step(0, grad), torch.device("cpu"))  # noqa: B023
    assert peaks[2**30] >= 2 * size and peaks[2**16] <= 2 * 2**16 + 4096

    class MyAdamW(torch.optim.AdamW):
        pass

    assert chunk_rows(MyAdamW([weight]), weight) is None and chunk_rows(opt, weight) == 64
