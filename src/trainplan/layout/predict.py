"""A learned predictor of conv time per layout (seed 004, section 4): a scikit-learn gradient-boosted
regression of log(forward + backward time) on the paper's features (layout, input, weight and output dims,
stride, padding, groups, dtype), trained on a sweep of random conv shapes; the models' own convs are held out."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd
import torch

from trainplan.layout.graph import ConvInfo
from trainplan.layout.measure import Timing, conv_time

LAYOUT_ID = {"nchw": 0, "nhwc": 1}
DTYPE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16, "float64": 64}
FEATURES = ["layout", "n", "cin", "h", "w", "cout", "kh", "kw", "hout", "wout", "stride_h", "stride_w",
            "pad_h", "pad_w", "groups", "dtype_bits", "log_macs", "log_in", "log_weight", "log_out"]


def sweep_shapes(count: int, seed: int, batch_size: int = 2, max_macs: float = 1e8) -> list[ConvInfo]:
    """``count`` random conv shapes in the ranges CNNs use (3-512 channels, 2-56 px, kernels 1-11, strides
    1-4, depthwise with probability 0.15, at most ``max_macs`` multiply-adds), deterministic for ``seed``."""
    rng = random.Random(seed)
    chans = [3, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512]
    shapes: list[ConvInfo] = []
    while len(shapes) < count:
        size = rng.choice([2, 3, 4, 6, 7, 8, 12, 14, 16, 24, 28, 32, 48, 56])
        k = rng.choice([1, 1, 3, 3, 3, 5, 7, 11])
        stride = rng.choice([1, 1, 1, 2, 2, 4] if k > 1 else [1, 1, 2])
        pad = rng.choice([0, k // 2])
        if size + 2 * pad < k:
            continue
        if rng.random() < 0.15:
            cin = cout = groups = rng.choice(chans[3:])
        else:
            cin, cout, groups = rng.choice(chans), rng.choice(chans[1:]), 1
        hout = (size + 2 * pad - k) // stride + 1
        if batch_size * cout * hout * hout * (cin // groups) * k * k > max_macs:
            continue
        shapes.append(ConvInfo(f"sweep{len(shapes)}", (batch_size, cin, size, size), (cout, cin // groups, k, k),
                               (batch_size, cout, hout, hout), (stride, stride), (pad, pad), (1, 1), groups,
                               True, "float32"))
    return shapes


def measure_sweep(shapes: list[ConvInfo], layouts: list[str], timing: Timing) -> pd.DataFrame:
    """Forward and backward time of every sweep shape in every layout (one row per shape)."""
    torch.set_num_threads(timing.threads)
    rows = []
    for conv in shapes:
        row = conv_row(conv)
        for lay in layouts:
            row[f"fwd_{lay}"], row[f"bwd_{lay}"] = conv_time(conv, lay, timing)
        rows.append(row)
    return pd.DataFrame(rows)


def conv_row(conv: ConvInfo) -> dict[str, Any]:
    """The table row describing a conv (the columns ``features`` reads)."""
    return {"conv": conv.id, "in_shape": list(conv.in_shape), "weight_shape": list(conv.weight_shape),
            "out_shape": list(conv.out_shape), "stride": list(conv.stride), "padding": list(conv.padding),
            "dilation": list(conv.dilation), "groups": conv.groups, "bias": conv.bias, "dtype": conv.dtype}


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
                     "dtype_bits": DTYPE_BITS.get(str(r.dtype), 32), "log_macs": np.log10(macs),
                     "log_in": np.log10(n * cin * h * w), "log_weight": np.log10(cout * cin_g * kh * kw),
                     "log_out": np.log10(n * cout * hout * wout)})
    return pd.DataFrame(rows, columns=FEATURES)


def _stack(convs: pd.DataFrame, layouts: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    x = pd.concat([features(convs, lay) for lay in layouts], ignore_index=True)
    y = np.concatenate([(convs[f"fwd_{lay}"] + convs[f"bwd_{lay}"]).to_numpy() for lay in layouts])
    return x, y


def fit(sweep: pd.DataFrame, layouts: list[str], seed: int = 0) -> Any:
    """Gradient-boosted trees on log time, trained on the sweep rows."""
    from sklearn.ensemble import GradientBoostingRegressor

    x, y = _stack(sweep, layouts)
    model = GradientBoostingRegressor(n_estimators=500, max_depth=4, learning_rate=0.05, subsample=0.8,
                                      random_state=seed)
    model.fit(x, np.log(np.maximum(y, 1e-7)))
    return model


def predict(model: Any, convs: pd.DataFrame, layouts: list[str]) -> pd.DataFrame:
    """Predicted forward+backward seconds per conv (index: conv id) and layout (columns)."""
    return pd.DataFrame({lay: np.exp(model.predict(features(convs, lay))) for lay in layouts},
                        index=convs["conv"].to_numpy())


def score(model: Any, convs: pd.DataFrame, layouts: list[str]) -> dict[str, float]:
    """R^2 (on seconds and on log seconds), median relative error, and how often the predicted faster layout
    is the measured faster one, over ``convs`` (held out from training)."""
    from sklearn.metrics import r2_score

    x, y = _stack(convs, layouts)
    pred = np.exp(model.predict(x))
    rel = np.abs(pred - y) / y
    pred_t = predict(model, convs, layouts)
    meas = {lay: (convs[f"fwd_{lay}"] + convs[f"bwd_{lay}"]).to_numpy() for lay in layouts}
    best_meas = np.argmin(np.stack([meas[lay] for lay in layouts]), axis=0)
    best_pred = np.argmin(pred_t[layouts].to_numpy().T, axis=0)
    return {"r2": float(r2_score(y, pred)), "r2_log": float(r2_score(np.log(y), np.log(pred))),
            "median_rel_error": float(np.median(rel)), "layout_choice_agreement": float(np.mean(best_meas == best_pred)),
            "rows": int(len(y))}
