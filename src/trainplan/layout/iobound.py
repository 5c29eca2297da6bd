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
- ``exact_dataflow_io``: a ``Dataflow`` counted exactly (ceil tiles, halos ``x' = mu (x - 1) + Wker``, padding
  and positions no window reads not read), which ``simulate_dataflow`` must reproduce element by element; besides
  the paper's output-stationary order (with ``keep`` input channels of a spatial tile's patch kept from one
  output block to the next, the channel order reversed each block) it counts an input-resident order (a spatial
  tile's patches of every channel kept while its output blocks are made), and ``best_dataflow`` picks order,
  stream, tile and ``keep`` for a fast memory of exactly S elements, buffers included.
Grouped convs are ``groups`` independent convs (per-group counts times ``groups``).
"""

from __future__ import annotations

import functools
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
    """Red-blue-pebble bound ``2 V / sqrt(R S)``, the compulsory I/O (every input a window reads, every weight,
    every output), and the bound (their maximum)."""
    work = c.n * c.wout * c.hout * c.cout * c.kw * c.kh * c.cin_g
    pebble = 2.0 * work / math.sqrt(max(c.reuse, 1.0) * s)  # R < 1 (stride > kernel): each used input serves one window
    (_, _, cols), = _axis_tiles(c.wout, c.wout, c.stride[1], c.kw, c.padding[1], c.w)
    (_, _, rows), = _axis_tiles(c.hout, c.hout, c.stride[0], c.kh, c.padding[0], c.h)
    compulsory = c.n * c.cin * len(rows) * len(cols) + c.cout * c.cin_g * c.kh * c.kw + c.n * c.cout * c.hout * c.wout
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


@functools.lru_cache(maxsize=4096)
def _axis_tiles(out: int, tile: int, stride: int, k: int, pad: int, size: int) -> tuple[tuple[int, int, np.ndarray], ...]:
    """Per tile along one axis: (first output, tile length, the input positions inside the image its windows read;
    with a stride above the kernel some positions between windows are never read). Cached (the tile search asks
    for each size many times): the position arrays are read-only."""
    tiles = []
    for o0 in range(0, out, tile):
        t = min(tile, out - o0)
        starts = np.arange(o0, o0 + t) * stride - pad
        touched = np.unique((starts[:, None] + np.arange(k)[None, :]).ravel())
        inside = touched[(touched >= 0) & (touched < size)]
        inside.setflags(write=False)
        tiles.append((o0, t, inside))
    return tuple(tiles)


@dataclass(frozen=True)
class Dataflow:
    """A tiled dataflow of direct convolution with output tiles ``b * x * y * z`` (``b`` images, which share each
    weight read).

    ``order``: ``output`` (the paper's: a tile's partial sums stay on chip while every input channel streams
    through once per tile; a spatial tile's ``z``-blocks are made one after another) or ``input`` (a spatial tile's
    input patches of every channel stay on chip while its ``z``-blocks of outputs are made in turn, so each input
    is read once per spatial tile).
    ``stream``: how a channel step enters the fast memory: ``rows`` (the ``z`` kernels' slice resident, the input
    patch one row at a time) or ``taps`` (the patch resident, the kernels one tap of ``z`` weights at a time).
    Both streams read the same elements; they differ in the buffer they need next to the partial sums.
    ``keep`` (output order): the patches of the last ``keep`` input channels a ``z``-block reads stay on chip for
    the next ``z``-block of the same spatial tile, which reads the channels in reverse order, so it starts with
    them: ``keep`` fewer channel reads per block after the first."""

    x: int
    y: int
    z: int
    order: str = "output"
    stream: str = "rows"
    b: int = 1
    keep: int = 0

    def __post_init__(self) -> None:
        if (self.order, self.stream) not in FLOWS:
            raise ValueError(f"unknown dataflow {self.order}/{self.stream}: one of {FLOWS}")
        if self.keep < 0 or (self.keep and self.order != "output"):
            raise ValueError(f"keep={self.keep}: kept channels need the output order and a count >= 0")

    @property
    def name(self) -> str:
        return f"{self.order}/{self.stream}"

    @property
    def tile(self) -> tuple[int, int, int]:
        return self.x, self.y, self.z


FLOWS = (("output", "rows"), ("output", "taps"), ("input", "taps"))  # input-resident patches need no row stream


def _tiles(c: ConvShape, x: int, y: int) -> tuple[tuple[tuple[int, int, np.ndarray], ...], tuple[tuple[int, int, np.ndarray], ...]]:
    return (_axis_tiles(c.wout, x, c.stride[1], c.kw, c.padding[1], c.w),
            _axis_tiles(c.hout, y, c.stride[0], c.kh, c.padding[0], c.h))


def exact_dataflow_io(c: ConvShape, flow: Dataflow) -> dict[str, int]:
    """Reads and writes of the dataflow counted exactly: ceil tiles, halos, only input positions a window reads."""
    xs, ys = _tiles(c, flow.x, flow.y)
    patches = sum(len(px) for *_, px in xs) * sum(len(py) for *_, py in ys)  # summed over the spatial tiles
    z_tiles = -(-c.cout_g // flow.z) if flow.order == "output" else 1
    reads = int(_reads(c, patches, len(xs) * len(ys), -(-c.n // flow.b), z_tiles, min(flow.keep, c.cin_g)))
    writes = c.n * c.cout * c.hout * c.wout
    return {"reads": reads, "writes": writes, "io": reads + writes}


def _reads(c: ConvShape, patches: int, spatial: int, b_tiles: int, input_passes, keep):
    """Off-chip reads: every input patch (``patches`` per image, summed over the ``spatial`` tiles) once per pass
    over the input channels less the ``keep`` channels kept between passes, every weight once per spatial tile
    and image block. ``input_passes`` and ``keep`` may be arrays (one dataflow per element)."""
    inputs = c.n * patches * (c.cin_g * input_passes - keep * (input_passes - 1))
    return c.groups * (inputs + c.cin_g * b_tiles * spatial * c.kh * c.kw * c.cout_g)


def _footprint(c: ConvShape, b: int, x: int, y: int, px: int, py: int, order: str, stream: str) -> tuple[int, int, int]:
    """Fast memory a tile of ``b`` images needs, as (fixed, per output channel, per kept input channel) elements:
    its partial sums and its stream's buffer."""
    if order == "input":
        return b * c.cin_g * px * py, b * x * y + 1, 0
    if stream == "taps":
        return b * px * py, b * x * y + 1, b * px * py
    return px, b * x * y + c.kh * c.kw, b * px * py


def best_dataflow(c: ConvShape, s: int) -> Dataflow:
    """The dataflow (order, stream, tile, images per tile, kept channels) that fits a fast memory of exactly ``s``
    elements (the tile's partial sums plus its stream's buffer and kept patches) with the fewest off-chip reads and
    writes (``exact_dataflow_io``)."""
    xs_all = {x: max(len(t[2]) for t in _tiles(c, x, 1)[0]) for x in range(1, c.wout + 1)}
    ys_all = {y: max(len(t[2]) for t in _tiles(c, 1, y)[1]) for y in range(1, c.hout + 1)}
    best, arg = math.inf, None
    for b in range(1, c.n + 1):
        b_tiles = -(-c.n // b)
        for x, px in xs_all.items():
            for y, py in ys_all.items():
                xs, ys = _tiles(c, x, y)
                patches = sum(len(t[2]) for t in xs) * sum(len(t[2]) for t in ys)
                for order, stream in FLOWS:
                    fixed, per_z, per_keep = _footprint(c, b, x, y, px, py, order, stream)
                    z_max = min(c.cout_g, (s - fixed) // per_z)
                    if z_max < 1:
                        continue
                    # every z up to the most that fits, each with the most kept channels the rest of s holds
                    zs = np.arange(z_max, 0, -1) if order == "output" else np.array([z_max])
                    passes = -(-c.cout_g // zs) if order == "output" else np.ones(1, dtype=int)
                    room = s - fixed - zs * per_z
                    keep = np.zeros_like(zs) if per_keep == 0 else np.minimum(c.cin_g, room // per_keep)
                    keep = np.where(passes > 1, keep, 0)
                    reads = _reads(c, patches, len(xs) * len(ys), b_tiles, passes, keep)
                    i = int(np.argmin(reads))  # ties: the largest z (fewest steps)
                    if reads[i] < best:
                        best, arg = reads[i], Dataflow(x, y, int(zs[i]), order, stream, b, int(keep[i]))
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

    def stream(self, chunks: np.ndarray) -> None:
        """Load each row of ``chunks`` (disjoint address sets) in turn and evict it before the next: a buffer of
        one chunk. Counted in one step: every non-resident element is one read; the peak is the largest chunk's."""
        fresh = ~self.resident[chunks]
        self.reads += int(fresh.sum())
        widest = int(fresh.sum(axis=1).max(initial=0))
        self.peak = max(self.peak, self.used + widest)
        if self.used + widest > self.capacity:
            raise MemoryError(f"fast memory over capacity: {self.used + widest} > {self.capacity} elements")

    def evict(self, addresses: np.ndarray, write: bool = False) -> None:
        gone = np.unique(addresses[self.resident[addresses]])
        self.resident[gone] = False
        self.used -= gone.size
        if write:
            self.writes += gone.size


@dataclass
class _Tile:
    """One spatial output tile: its output ranges, its input window origin and extent (padding included) and the
    input rows and columns inside the image that its windows read."""

    y0: int
    yt: int
    x0: int
    xt: int
    r0: int
    c0: int
    height: int
    width: int
    rows: np.ndarray
    cols: np.ndarray


def _spatial_tiles(c: ConvShape, x: int, y: int) -> list[_Tile]:
    xs, ys = _tiles(c, x, y)
    (sh, sw), (ph, pw) = c.stride, c.padding
    return [_Tile(y0, yt, x0, xt, y0 * sh - ph, x0 * sw - pw, (yt - 1) * sh + c.kh, (xt - 1) * sw + c.kw, rows, cols)
            for y0, yt, rows in ys for x0, xt, cols in xs]


def simulate_dataflow(c: ConvShape, s: int, flow: Dataflow | None = None,
                      inputs: np.ndarray | None = None, weights: np.ndarray | None = None) -> dict[str, object]:
    """Run the tiled dataflow (``best_dataflow`` unless given) through a ``FastMemory`` of ``s`` elements, moving
    every element it names, and compute the convolution with it. Returns read/write counts, the dataflow, the
    peak occupancy and the output (so callers can check it equals the convolution)."""
    flow = flow or best_dataflow(c, s)
    rng = np.random.default_rng(0)
    inp = rng.standard_normal((c.n, c.cin, c.h, c.w)) if inputs is None else inputs
    wgt = rng.standard_normal((c.cout, c.cin_g, c.kh, c.kw)) if weights is None else weights
    run = _Run(c, FastMemory(s, inp.size + wgt.size + c.n * c.cout * c.hout * c.wout), inp, wgt)
    tiles = _spatial_tiles(c, flow.x, flow.y)
    for b0 in range(0, c.n, flow.b):
        imgs = slice(b0, min(b0 + flow.b, c.n))
        for g in range(c.groups):
            z_blocks = [slice(g * c.cout_g + z0, g * c.cout_g + min(z0 + flow.z, c.cout_g))
                        for z0 in range(0, c.cout_g, flow.z)]
            chans = range(g * c.cin_g, (g + 1) * c.cin_g)
            if flow.order == "output":
                for t in tiles:
                    kept: dict[int, np.ndarray] = {}  # channel -> its resident patch's addresses
                    for k, co in enumerate(z_blocks):
                        order = list(chans) if k % 2 == 0 else list(reversed(chans))
                        retain = set(order[len(order) - flow.keep:]) if flow.keep and k + 1 < len(z_blocks) else set()
                        run.output_tile(flow.stream, imgs, order, chans[0], co, t, kept, retain)
            else:
                for t in tiles:
                    patch_addr = np.concatenate([run.patch_addr(imgs, ch, t) for ch in chans])
                    run.mem.load(patch_addr)
                    patches = {ch: run.patch(imgs, ch, t) for ch in chans}
                    for co in z_blocks:
                        acc = run.open_tile(imgs, co, t)
                        for ci, ch in enumerate(chans):
                            run.taps(co, ci, patches[ch], t, acc)
                        run.close_tile(imgs, co, t, acc)
                    run.mem.evict(patch_addr)
    mem = run.mem
    return {"reads": mem.reads, "writes": mem.writes, "io": mem.reads + mem.writes, "tile": flow.tile,
            "flow": flow, "peak": mem.peak, "output": run.out}


class _Run:
    """A simulation's state: the fast memory, the off-chip tensors and their addresses, the output being made."""

    def __init__(self, c: ConvShape, mem: FastMemory, inp: np.ndarray, wgt: np.ndarray) -> None:
        self.c, self.mem, self.inp, self.wgt = c, mem, inp, wgt
        self.out = np.zeros((c.n, c.cout, c.hout, c.wout))
        self.in_addr = np.arange(inp.size).reshape(inp.shape)
        self.w_addr = inp.size + np.arange(wgt.size).reshape(wgt.shape)
        self.out_addr = inp.size + wgt.size + np.arange(self.out.size).reshape(self.out.shape)

    def patch_addr(self, imgs: slice, ch: int, t: _Tile) -> np.ndarray:
        return self.in_addr[imgs, ch][:, t.rows][:, :, t.cols].ravel()

    def patch(self, imgs: slice, ch: int, t: _Tile) -> np.ndarray:
        """The tile's input windows of one channel, per image (padding and never-read positions zero)."""
        patch = np.zeros((imgs.stop - imgs.start, t.height, t.width))
        patch[:, (t.rows - t.r0)[:, None], (t.cols - t.c0)[None, :]] = self.inp[imgs, ch][:, t.rows][:, :, t.cols]
        return patch

    def _out(self, imgs: slice, co: slice, t: _Tile) -> np.ndarray:
        return self.out_addr[imgs, co, t.y0:t.y0 + t.yt, t.x0:t.x0 + t.xt].ravel()

    def open_tile(self, imgs: slice, co: slice, t: _Tile) -> np.ndarray:
        self.mem.allocate(self._out(imgs, co, t))
        return np.zeros((imgs.stop - imgs.start, co.stop - co.start, t.yt, t.xt))

    def close_tile(self, imgs: slice, co: slice, t: _Tile, acc: np.ndarray) -> None:
        self.out[imgs, co, t.y0:t.y0 + t.yt, t.x0:t.x0 + t.xt] = acc
        self.mem.evict(self._out(imgs, co, t), write=True)

    def taps(self, co: slice, ci: int, patch: np.ndarray, t: _Tile, acc: np.ndarray) -> None:
        """Accumulate resident input patches (one per image), streaming the kernels one tap of ``z`` weights at a
        time."""
        self.mem.stream(self.w_addr[co, ci].reshape(co.stop - co.start, -1).T)
        self.accumulate(co, ci, patch, t, acc)

    def accumulate(self, co: slice, ci: int, patch: np.ndarray, t: _Tile, acc: np.ndarray) -> None:
        """The arithmetic of one channel step: every tap of the ``z`` kernels over the tile's windows."""
        (sh, sw), c = self.c.stride, self.c
        for i in range(c.kh):
            for j in range(c.kw):
                win = patch[:, i:i + (t.yt - 1) * sh + 1:sh, j:j + (t.xt - 1) * sw + 1:sw]
                acc += self.wgt[co, ci, i, j][None, :, None, None] * win[:, None]

    def output_tile(self, stream: str, imgs: slice, order: list[int], first: int, co: slice, t: _Tile,
                    kept: dict[int, np.ndarray], retain: set[int]) -> None:
        """One output-stationary tile: its partial sums stay on chip while every input channel streams through, in
        ``order`` (``first``: the group's first channel). Channels in ``kept`` are on chip already; those in
        ``retain`` are loaded whole and stay (added to ``kept``), the others leave after their step."""
        acc = self.open_tile(imgs, co, t)
        for ch in order:
            ci = ch - first
            if ch in kept or ch in retain:
                if ch not in kept:
                    kept[ch] = self.patch_addr(imgs, ch, t)
                    self.mem.load(kept[ch])
                if stream == "taps":
                    self.taps(co, ci, self.patch(imgs, ch, t), t, acc)
                else:
                    kern = self.w_addr[co, ci].ravel()
                    self.mem.load(kern)
                    self.accumulate(co, ci, self.patch(imgs, ch, t), t, acc)
                    self.mem.evict(kern)
                if ch not in retain:
                    self.mem.evict(kept.pop(ch))
                continue
            if stream == "taps":
                patch_addr = self.patch_addr(imgs, ch, t)
                self.mem.load(patch_addr)
                self.taps(co, ci, self.patch(imgs, ch, t), t, acc)
                self.mem.evict(patch_addr)
                continue
            kern = self.w_addr[co, ci].ravel()
            self.mem.load(kern)
            # one input row at a time (of each image), every tap it feeds applied while it is on chip
            self.mem.stream(self.in_addr[imgs, ch][:, t.rows][:, :, t.cols].reshape(-1, len(t.cols)))
            self.accumulate(co, ci, self.patch(imgs, ch, t), t, acc)
            self.mem.evict(kern)
        self.close_tile(imgs, co, t, acc)


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
                flow = best_dataflow(c, s)
            except ValueError:
                rows.append(row)
                continue
            steps = (math.ceil(c.n / flow.b) * c.groups * c.cin_g * math.ceil(c.wout / flow.x)
                     * math.ceil(c.hout / flow.y) * math.ceil(c.cout_g / flow.z))
            exact = exact_dataflow_io(c, flow)["io"]
            row.update({"sim_flow": flow.name, "sim_tile": "x".join(map(str, flow.tile)), "sim_images": flow.b,
                        "sim_keep": flow.keep,
                        "exact_io": exact,
                        "exact_ratio": exact / lb["bound"]})
            if steps <= simulate_steps:
                sim = simulate_dataflow(c, s, flow)
                row.update({"simulated_io": sim["io"], "simulated_ratio": sim["io"] / lb["bound"], "sim_peak": sim["peak"]})
            rows.append(row)
    return pd.DataFrame(rows)
