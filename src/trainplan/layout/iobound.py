"""Off-chip I/O of direct convolution (seed 004, section 3, extending Chen, Han and Wang, HPCA 2020).

Counts are in elements. For a conv with output ``Wout x Hout x Cout`` per image (N images), kernel
``Wker x Hker``, ``Cin`` input channels per group, stride ``mu`` (``mu^2 = stride_h * stride_w``):

- reuse ``R = Wker * Hker / mu^2``; work ``V = N * Wout * Hout * Cout * Wker * Hker * Cin``;
- red-blue-pebble lower bound for fast memory ``S``: ``Q_pebble = 2 V / sqrt(R S)`` (the multi-stage bound
  whose leading term the paper's dataflow attains), and the compulsory ``|input| + |weights| + |output|``;
  the bound reported is the larger of the two;
- the paper's dataflow: output tiles ``x * y * z`` with ``x y z ~ S / Np`` and ``x y = R z``; per tile, the input
  patch ``x' y'`` (``x' ~ mu x``) and the ``z`` kernels' ``Wker Hker`` weights are streamed one channel at a
  time; I/O ``Q = (N Wout Hout Cout / (x y z)) (x' y' Cin + Wker Hker Cin z) + N Wout Hout Cout``;
- ``exact_dataflow_io``: the same dataflow counted exactly (ceil tiles, halos ``x' = mu (x - 1) + Wker``,
  padding not read), which ``simulate_dataflow`` must reproduce element by element.
Grouped convs are ``groups`` independent convs (per-group counts times ``groups``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ConvShape:
    """A conv's dimensions (NCHW input, OIHW weight)."""

    n: int
    cin: int
    h: int
    w: int
    cout: int
    kh: int
    kw: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    groups: int = 1

    @property
    def hout(self) -> int:
        return (self.h + 2 * self.padding[0] - self.kh) // self.stride[0] + 1

    @property
    def wout(self) -> int:
        return (self.w + 2 * self.padding[1] - self.kw) // self.stride[1] + 1

    @property
    def cin_g(self) -> int:
        return self.cin // self.groups

    @property
    def cout_g(self) -> int:
        return self.cout // self.groups

    @property
    def reuse(self) -> float:
        """R = Wker Hker / mu^2: the most windows one input element serves."""
        return self.kh * self.kw / (self.stride[0] * self.stride[1])


def lower_bound(c: ConvShape, s: float) -> dict[str, float]:
    """Red-blue-pebble bound ``2 V / sqrt(R S)``, the compulsory I/O, and the bound (their maximum)."""
    work = c.n * c.wout * c.hout * c.cout * c.kw * c.kh * c.cin_g
    pebble = 2.0 * work / math.sqrt(max(c.reuse, 1.0) * s)  # R < 1 (stride > kernel): each used input serves one window
    compulsory = c.n * c.cin * c.h * c.w + c.cout * c.cin_g * c.kh * c.kw + c.n * c.cout * c.hout * c.wout
    return {"pebble": pebble, "compulsory": float(compulsory), "bound": max(pebble, float(compulsory))}


def paper_io(c: ConvShape, x: int, y: int, z: int) -> float:
    """The paper's dataflow I/O for tile (x, y, z), with ``x' = mu x``, ``y' = mu y``."""
    mu2 = c.stride[0] * c.stride[1]
    per_group = (c.n * c.wout * c.hout * c.cout_g / (x * y * z)) * (mu2 * x * y * c.cin_g + c.kw * c.kh * c.cin_g * z)
    return c.groups * (per_group + c.n * c.wout * c.hout * c.cout_g)


def paper_tile(c: ConvShape, s: float, cores: int = 1) -> tuple[int, int, int]:
    """The tile (x, y, z) of the paper: integers with ``x y z <= S / Np`` minimising ``paper_io`` (so ``x y``
    lands near ``R z`` and ``x y z`` near ``S / Np`` where the conv is large enough)."""
    cap = s / cores
    xs = np.arange(1, c.wout + 1)[:, None]
    ys = np.arange(1, c.hout + 1)[None, :]
    zs = np.minimum(c.cout_g, np.floor(cap / (xs * ys))).astype(int)
    valid = zs >= 1
    mu2 = c.stride[0] * c.stride[1]
    zsafe = np.maximum(zs, 1)
    io = (mu2 * xs * ys * c.cin_g + c.kw * c.kh * c.cin_g * zsafe) / (xs * ys * zsafe)
    io = np.where(valid, io, np.inf)
    i, j = np.unravel_index(int(np.argmin(io)), io.shape)
    if not np.isfinite(io[i, j]):
        raise ValueError(f"fast memory S={s} over {cores} cores cannot hold one output element")
    return int(xs[i, 0]), int(ys[0, j]), int(zs[i, j])


def _spans(out: int, tile: int, stride: int, k: int, pad: int, size: int) -> list[tuple[int, int, int]]:
    """Per tile along one axis: (first output, tile length, input elements read inside the image)."""
    spans = []
    for o0 in range(0, out, tile):
        t = min(tile, out - o0)
        lo, hi = o0 * stride - pad, (o0 + t - 1) * stride - pad + k
        spans.append((o0, t, max(0, min(hi, size) - max(lo, 0))))
    return spans


def exact_dataflow_io(c: ConvShape, x: int, y: int, z: int) -> dict[str, int]:
    """Reads and writes of the dataflow counted exactly: ceil tiles, halos, padding not read."""
    xs = _spans(c.wout, x, c.stride[1], c.kw, c.padding[1], c.w)
    ys = _spans(c.hout, y, c.stride[0], c.kh, c.padding[0], c.h)
    zt = [min(z, c.cout_g - z0) for z0 in range(0, c.cout_g, z)]
    patch = sum(px for _, _, px in xs) * sum(py for _, _, py in ys)
    reads = c.n * c.groups * c.cin_g * (patch * len(zt) + len(xs) * len(ys) * c.kh * c.kw * sum(zt))
    writes = c.n * c.cout * c.hout * c.wout
    return {"reads": reads, "writes": writes, "io": reads + writes}


def buffered_tile(c: ConvShape, s: int) -> tuple[int, int, int]:
    """The tile for a fast memory of exactly ``s`` elements holding the ``x y z`` partial sums, one channel's
    input patch and the ``z`` kernels' slice at once; minimises the exact dataflow I/O."""
    best, arg = math.inf, None
    for x in range(1, c.wout + 1):
        for y in range(1, c.hout + 1):
            px = min(c.stride[1] * (x - 1) + c.kw, c.w + 2 * c.padding[1])
            py = min(c.stride[0] * (y - 1) + c.kh, c.h + 2 * c.padding[0])
            z = min(c.cout_g, (s - px * py) // (x * y + c.kh * c.kw)) if s > px * py else 0
            if z < 1:
                continue
            io = exact_dataflow_io(c, x, y, z)["io"]
            if io < best:
                best, arg = io, (x, y, z)
    if arg is None:
        raise ValueError(f"fast memory of {s} elements cannot hold one tile of this conv")
    return arg


class FastMemory:
    """An explicit fast memory of ``capacity`` elements over an off-chip address space: loading a missing
    element is one read, flushing a resident output one write; exceeding the capacity is an error."""

    def __init__(self, capacity: int, size: int) -> None:
        self.capacity = capacity
        self.resident = np.zeros(size, dtype=bool)
        self.used = 0
        self.reads = 0
        self.writes = 0
        self.peak = 0

    def load(self, addresses: np.ndarray) -> None:
        new = np.unique(addresses[~self.resident[addresses]])
        self.reads += new.size
        self._hold(new)

    def allocate(self, addresses: np.ndarray) -> None:
        """Space for values made on chip (partial sums): no read."""
        self._hold(np.unique(addresses[~self.resident[addresses]]))

    def _hold(self, new: np.ndarray) -> None:
        self.resident[new] = True
        self.used += new.size
        self.peak = max(self.peak, self.used)
        if self.used > self.capacity:
            raise MemoryError(f"fast memory over capacity: {self.used} > {self.capacity} elements")

    def evict(self, addresses: np.ndarray, write: bool = False) -> None:
        gone = np.unique(addresses[self.resident[addresses]])
        self.resident[gone] = False
        self.used -= gone.size
        if write:
            self.writes += gone.size


def simulate_dataflow(c: ConvShape, s: int, tile: tuple[int, int, int] | None = None,
                      inputs: np.ndarray | None = None, weights: np.ndarray | None = None) -> dict[str, object]:
    """Run the tiled dataflow through a ``FastMemory`` of ``s`` elements: per output tile, keep its partial
    sums on chip, stream each input channel's patch and the tile's kernel slices in, accumulate, evict them,
    and write the finished tile out. Returns read/write counts, the tile, the peak occupancy and the output
    (so callers can check it equals the convolution)."""
    x, y, z = tile or buffered_tile(c, s)
    rng = np.random.default_rng(0)
    inp = rng.standard_normal((c.n, c.cin, c.h, c.w)) if inputs is None else inputs
    wgt = rng.standard_normal((c.cout, c.cin_g, c.kh, c.kw)) if weights is None else weights
    n_in, n_w = inp.size, wgt.size
    out = np.zeros((c.n, c.cout, c.hout, c.wout))
    in_addr = np.arange(n_in).reshape(inp.shape)
    w_addr = n_in + np.arange(n_w).reshape(wgt.shape)
    out_addr = n_in + n_w + np.arange(out.size).reshape(out.shape)
    mem = FastMemory(s, n_in + n_w + out.size)
    sh, sw = c.stride
    ph, pw = c.padding
    for b in range(c.n):
        for g in range(c.groups):
            for z0 in range(0, c.cout_g, z):
                co = slice(g * c.cout_g + z0, g * c.cout_g + min(z0 + z, c.cout_g))
                for y0 in range(0, c.hout, y):
                    yt = min(y, c.hout - y0)
                    for x0 in range(0, c.wout, x):
                        xt = min(x, c.wout - x0)
                        acc_addr = out_addr[b, co, y0:y0 + yt, x0:x0 + xt].ravel()
                        mem.allocate(acc_addr)
                        acc = np.zeros((co.stop - co.start, yt, xt))
                        r0, c0 = y0 * sh - ph, x0 * sw - pw
                        r1, c1 = r0 + (yt - 1) * sh + c.kh, c0 + (xt - 1) * sw + c.kw
                        rr, cc = slice(max(r0, 0), min(r1, c.h)), slice(max(c0, 0), min(c1, c.w))
                        for ci in range(c.cin_g):
                            chan = g * c.cin_g + ci
                            patch_addr = in_addr[b, chan, rr, cc].ravel()
                            kern_addr = w_addr[co, ci].ravel()
                            mem.load(patch_addr)
                            mem.load(kern_addr)
                            patch = np.zeros((r1 - r0, c1 - c0))
                            patch[rr.start - r0:rr.stop - r0, cc.start - c0:cc.stop - c0] = inp[b, chan, rr, cc]
                            for i in range(c.kh):
                                for j in range(c.kw):
                                    win = patch[i:i + (yt - 1) * sh + 1:sh, j:j + (xt - 1) * sw + 1:sw]
                                    acc += wgt[co, ci, i, j][:, None, None] * win[None]
                            mem.evict(patch_addr)
                            mem.evict(kern_addr)
                        out[b, co, y0:y0 + yt, x0:x0 + xt] = acc
                        mem.evict(acc_addr, write=True)
    return {"reads": mem.reads, "writes": mem.writes, "io": mem.reads + mem.writes, "tile": (x, y, z),
            "peak": mem.peak, "output": out}


def conv_shape(row: object) -> ConvShape:
    """The ConvShape of a row of a conv table (``in_shape``, ``weight_shape``, ``stride``, ``padding``, ``groups``)."""
    n, cin, h, w = (int(v) for v in row.in_shape)
    cout, _, kh, kw = (int(v) for v in row.weight_shape)
    return ConvShape(n, cin, h, w, cout, kh, kw, (int(row.stride[0]), int(row.stride[1])),
                     (int(row.padding[0]), int(row.padding[1])), int(row.groups))


def io_table(convs: "pd.DataFrame", sizes: list[int], cores: int, simulate_steps: int) -> "pd.DataFrame":
    """Per conv and fast-memory size S: the bound, the paper's tile and I/O and its ratio to the bound, and, where
    the dataflow takes at most ``simulate_steps`` channel steps, the simulated I/O with a fast memory of S."""
    import pandas as pd

    rows = []
    for r in convs.itertuples(index=False):
        c = conv_shape(r)
        for s in sizes:
            lb = lower_bound(c, s)
            row = {"conv": r.conv, "S": s, "Np": cores, "R": c.reuse, **lb}
            try:
                x, y, z = paper_tile(c, s, cores)
            except ValueError:
                rows.append(row)
                continue
            q = paper_io(c, x, y, z)
            row.update({"x": x, "y": y, "z": z, "xy_over_Rz": x * y / (c.reuse * z), "xyz_over_S_Np": x * y * z * cores / s,
                        "paper_io": q, "paper_ratio": q / lb["bound"]})
            try:
                bx, by, bz = buffered_tile(c, s)
            except ValueError:
                rows.append(row)
                continue
            steps = c.n * c.groups * c.cin_g * math.ceil(c.wout / bx) * math.ceil(c.hout / by) * math.ceil(c.cout_g / bz)
            exact = exact_dataflow_io(c, bx, by, bz)["io"]
            row.update({"sim_tile": f"{bx}x{by}x{bz}", "exact_io": exact, "exact_ratio": exact / lb["bound"]})
            if steps <= simulate_steps:
                sim = simulate_dataflow(c, s, (bx, by, bz))
                row.update({"simulated_io": sim["io"], "simulated_ratio": sim["io"] / lb["bound"], "sim_peak": sim["peak"]})
            rows.append(row)
    return pd.DataFrame(rows)
