"""A learned predictor of conv time per layout (seed 004, section 4): a scikit-learn gradient-boosted
regression of log(forward + backward time per multiply-add) on the paper's features (layout, input, weight and
output dims, stride, padding, groups, dtype), trained on a sweep of random conv shapes; the models' own convs
are held out."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import numpy as np
import pandas as pd

from trainplan.layout.graph import ConvInfo
from trainplan.layout.measure import Timing, time_in_worker

LAYOUT_ID = {"nchw": 0, "nhwc": 1}
DTYPE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16, "float64": 64}
FEATURES = ["layout", "n", "cin", "h", "w", "cout", "kh", "kw", "hout", "wout", "stride_h", "stride_w",
            "pad_h", "pad_w", "groups", "cin_per_group", "bias", "input_grad", "dtype_bits", "log_macs", "log_in",
            "log_weight", "log_out"]


SIZES = [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 17, 18, 24, 28, 32, 33, 34, 48, 56, 64, 65]
CHANNELS = [3, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160, 192, 256, 320, 384, 512, 576, 768, 960, 1024, 1280,
            2048]
DENSE_KERNELS = [1, 1, 1, 2, 3, 3, 3, 4, 5, 7, 11]  # 2 and 4: patchify stems (stride = kernel)
DEPTHWISE_KERNELS = [3, 3, 5, 7, 7]
DEPTHWISE_SHARE = 0.25
PROGRESS_EVERY = 50
IMAGE_CHANNELS = 3  # a sweep conv reading this many channels is a stem: timed without an input gradient


def sweep_sizes(image_size: int) -> list[int]:
    """Input sides the sweep draws from: SIZES, plus, for a study image larger than they reach, the image side
    and each halving of it above SIZES' largest, each with its odd neighbour (a 224 px study: 112, 113, 224, 225).
    Trees do not extrapolate: convs larger than any in the sweep are mispredicted (docs/layout.md)."""
    sizes, side = list(SIZES), image_size
    while side > SIZES[-1]:
        sizes += [side, side + 1]
        side //= 2
    return sorted(set(sizes))


def sweep_shapes(count: int, seed: int, batch_size: int = 2, max_macs: float = 4e8,
                 image_size: int = 64) -> list[ConvInfo]:
    """``count`` random conv shapes in the ranges CNNs use, deterministic for ``seed``: sides from
    :func:`sweep_sizes` (odd sizes as explicit padding makes them), 3-2048 channels; dense kernels 1-11 (patchify
    2x2 and 4x4 with stride = kernel), depthwise 3x3-7x7 with probability DEPTHWISE_SHARE; strides 1-4; bias or
    not; at most ``max_macs`` multiply-adds."""
    rng = random.Random(seed)
    sizes = sweep_sizes(image_size)
    shapes: list[ConvInfo] = []
    while len(shapes) < count:
        size = rng.choice(sizes)
        if rng.random() < DEPTHWISE_SHARE:
            k = rng.choice(DEPTHWISE_KERNELS)
            stride = rng.choice([1, 1, 2])
            cin = cout = groups = rng.choice(CHANNELS[2:])
        else:
            k = rng.choice(DENSE_KERNELS)
            stride = k if k in (2, 4) else rng.choice([1, 1, 2] if k < 7 else [1, 2, 2, 4])
            cin, cout, groups = rng.choice(CHANNELS), rng.choice(CHANNELS[1:]), 1
        pad = 0 if k in (2, 4) else rng.choice([0, k // 2])
        if size + 2 * pad < k:
            continue
        hout = (size + 2 * pad - k) // stride + 1
        if batch_size * cout * hout * hout * (cin // groups) * k * k > max_macs:
            continue
        shapes.append(ConvInfo(f"sweep{len(shapes)}", (batch_size, cin, size, size), (cout, cin // groups, k, k),
                               (batch_size, cout, hout, hout), (stride, stride), (pad, pad), (1, 1), groups,
                               rng.random() < 0.5, "float32"))
    return shapes


def measure_sweep(shapes: list[ConvInfo], layouts: list[str], timing: Timing, log: logging.Logger | None = None,
                  time_limit: float | None = None) -> pd.DataFrame:
    """Forward and backward time of every sweep shape in every layout (one row per shape), timed in a worker
    process (:func:`trainplan.layout.measure.time_in_worker`): a shape torch refuses or one that kills its
    worker keeps its row with ``error`` set and no times. ``log`` gets progress every PROGRESS_EVERY shapes.
    With a ``time_limit`` (seconds), no shape is started after it: the table holds the shapes timed before (a
    prefix of ``shapes``, which are drawn at random, so a random sample of them)."""
    deadline = None if time_limit is None else time.time() + time_limit
    rows = time_in_worker(shapes, [_input_grad(c) for c in shapes], layouts, timing, log,
                          progress_every=PROGRESS_EVERY, deadline=deadline)
    if len(rows) < len(shapes) and log is not None:
        log.warning("sweep time limit of %g s reached: %d of %d shapes timed", time_limit, len(rows), len(shapes))
    return pd.DataFrame(rows)


def _input_grad(conv: ConvInfo) -> bool:
    """Whether a sweep conv is timed with an input gradient (not for a stem reading the image)."""
    return conv.in_shape[1] != IMAGE_CHANNELS


def features(convs: pd.DataFrame, layout: str) -> pd.DataFrame:
    """The paper's features of every conv row in ``layout`` (plus log sizes and MACs)."""
    rows = []
    for r in convs.itertuples(index=False):
        n, cin, h, w = (int(v) for v in r.in_shape)
        cout, cin_g, kh, kw = (int(v) for v in r.weight_shape)
        _, _, hout, wout = (int(v) for v in r.out_shape)
        macs = n * cout * hout * wout * cin_g * kh * kw
        rows.append({"layout": LAYOUT_ID[layout], "n": n, "cin": cin, "h": h, "w": w, "cout": cout, "kh": kh,
                     "kw": kw, "hout": hout, "wout": wout, "stride_h": int(r.stride[0]), "stride_w": int(r.stride[1]),
                     "pad_h": int(r.padding[0]), "pad_w": int(r.padding[1]), "groups": int(r.groups),
                     "cin_per_group": cin_g, "bias": int(bool(r.bias)),
                     "input_grad": int(bool(getattr(r, "input_grad", True))),
                     "dtype_bits": DTYPE_BITS.get(str(r.dtype), 32), "log_macs": np.log10(macs),
                     "log_in": np.log10(n * cin * h * w), "log_weight": np.log10(cout * cin_g * kh * kw),
                     "log_out": np.log10(n * cout * hout * wout)})
    return pd.DataFrame(rows, columns=FEATURES)


def outside_sweep(sweep: pd.DataFrame, convs: pd.DataFrame) -> int:
    """How many of ``convs`` lie beyond the sweep's timed shapes: more multiply-adds or a larger input side than
    any of them (the trees predict those as the sweep's largest: constant time per multiply-add)."""
    timed, ours = features(_timed(sweep), "nchw"), features(convs, "nchw")
    side = ours[["h", "w"]].max(axis=1)
    beyond = (ours["log_macs"] > timed["log_macs"].max()) | (side > timed[["h", "w"]].to_numpy().max())
    return int(beyond.sum())


def _timed(convs: pd.DataFrame) -> pd.DataFrame:
    """The rows that were timed (a sweep's crashed shapes left out)."""
    return convs[convs["error"].fillna("") == ""] if "error" in convs else convs


def _stack(convs: pd.DataFrame, layouts: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """Features and measured forward + backward seconds of every timed row, one block per layout."""
    convs = _timed(convs)
    x = pd.concat([features(convs, lay) for lay in layouts], ignore_index=True)
    y = np.concatenate([(convs[f"fwd_{lay}"] + convs[f"bwd_{lay}"]).to_numpy() for lay in layouts])
    return x, y


def _log_macs(x: pd.DataFrame) -> np.ndarray:
    return x["log_macs"].to_numpy() * np.log(10)


def fit(sweep: pd.DataFrame, layouts: list[str], seed: int = 0) -> Any:
    """Gradient-boosted trees on log(seconds per multiply-add), trained on the sweep's timed rows: time per
    multiply-add stays in a narrow range, so beyond the sweep's sizes the model extrapolates as constant
    efficiency rather than as constant time."""
    from sklearn.ensemble import GradientBoostingRegressor

    x, y = _stack(sweep, layouts)
    model = GradientBoostingRegressor(n_estimators=500, max_depth=4, learning_rate=0.05, subsample=0.8,
                                      random_state=seed)
    model.fit(x, np.log(np.maximum(y, 1e-7)) - _log_macs(x))
    return model


def _seconds(model: Any, x: pd.DataFrame) -> np.ndarray:
    return np.exp(model.predict(x) + _log_macs(x))


def predict(model: Any, convs: pd.DataFrame, layouts: list[str]) -> pd.DataFrame:
    """Predicted forward+backward seconds per conv (index: conv id) and layout (columns)."""
    return pd.DataFrame({lay: _seconds(model, features(convs, lay)) for lay in layouts},
                        index=convs["conv"].to_numpy())


def score(model: Any, convs: pd.DataFrame, layouts: list[str]) -> dict[str, float]:
    """R^2 (on seconds and on log seconds), median relative error, and how often the predicted faster layout
    is the measured faster one, over the timed rows of ``convs`` (held out from training)."""
    from sklearn.metrics import r2_score

    convs = _timed(convs)
    x, y = _stack(convs, layouts)
    pred = _seconds(model, x)
    rel = np.abs(pred - y) / y
    pred_t = predict(model, convs, layouts)
    meas = {lay: (convs[f"fwd_{lay}"] + convs[f"bwd_{lay}"]).to_numpy() for lay in layouts}
    best_meas = np.argmin(np.stack([meas[lay] for lay in layouts]), axis=0)
    best_pred = np.argmin(pred_t[layouts].to_numpy().T, axis=0)
    return {"r2": float(r2_score(y, pred)), "r2_log": float(r2_score(np.log(y), np.log(pred))),
            "median_rel_error": float(np.median(rel)), "layout_choice_agreement": float(np.mean(best_meas == best_pred)),
            "rows": int(len(y))}
