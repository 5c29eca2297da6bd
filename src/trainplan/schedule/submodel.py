"""A CP-SAT model with most of its variables fixed to a solution, reduced to the part that stays free.

A neighbourhood of the schedule model (:mod:`trainplan.schedule.lns`) frees a few thousand of tens of thousands
of variables. Solving a clone with the rest fixed made CP-SAT load and presolve the whole model every time
(0.1-0.2 s per neighbourhood on a 2000-op graph), and search with every fixed interval still in its cumulative
(1-9 s for an op neighbourhood there). :class:`Reducer` reads the model once; :meth:`Reducer.sub_model` then
builds a model of the free variables alone: fixed terms become constants, a constraint on fixed variables alone
is dropped (the solution satisfies it), the fixed intervals of a no-overlap merge into runs, and those of a
cumulative become its fixed usage per position, kept only where the free intervals could reach the capacity,
with neighbouring levels within ``PROFILE_SLACK`` of the capacity merged into their maximum where the solution
still fits (a slightly smaller neighbourhood: with the exact profile an op neighbourhood of a 2000-op graph kept
~2200 constant intervals in the cumulative, and its search crawled). Every answer of the sub-model, put
back into the solution, satisfies the whole model.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ortools.sat import cp_model_pb2
from ortools.sat.python import cp_model

Expr = tuple[tuple[int, ...], tuple[int, ...], int]  # variables, coefficients, offset
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
PROFILE_SLACK = 0.02  # levels this share of the capacity apart merge (0: the exact profile)


@dataclass(frozen=True)
class _Con:
    kind: str  # linear | bool_or | bool_and | interval | no_overlap | cumulative
    enf: tuple[int, ...]  # enforcement literals
    lits: tuple[int, ...] = ()  # bool_or, bool_and
    exprs: tuple[Expr, ...] = ()  # linear: its terms; interval: start, end, size; cumulative: capacity, demands
    domain: tuple[int, ...] = ()  # linear
    intervals: tuple[int, ...] = ()  # no_overlap, cumulative: constraint indices


def _expr(e) -> Expr:
    return tuple(e.vars), tuple(e.coeffs), e.offset


def _parse(c: cp_model_pb2.ConstraintProto) -> _Con:
    enf, kind = tuple(c.enforcement_literal), c.WhichOneof("constraint")
    if kind == "linear":
        lin = c.linear
        return _Con(kind, enf, exprs=((tuple(lin.vars), tuple(lin.coeffs), 0),), domain=tuple(lin.domain))
    if kind in ("bool_or", "bool_and"):
        return _Con(kind, enf, lits=tuple(getattr(c, kind).literals))
    if kind == "interval":
        return _Con(kind, enf, exprs=(_expr(c.interval.start), _expr(c.interval.end), _expr(c.interval.size)))
    if kind == "no_overlap":
        return _Con(kind, enf, intervals=tuple(c.no_overlap.intervals))
    if kind == "cumulative":
        cu = c.cumulative
        return _Con(kind, enf, exprs=(_expr(cu.capacity), *(_expr(d) for d in cu.demands)),
                    intervals=tuple(cu.intervals))
    raise ValueError(f"submodel: a {kind} constraint is of a kind the reducer does not handle")


def _read(model: cp_model.CpModel) -> cp_model_pb2.CpModelProto:
    """The model as a protobuf message. CP-SAT's Python wrapper has no serialisation, so through its binary
    export: :class:`Reducer` reads a 76k-constraint model in 0.7 s this way, in 1.6 s field by field through the
    wrapper."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.pb"
        if not model.export_to_file(str(path)):
            raise RuntimeError(f"submodel: CP-SAT could not export the model to {path}")
        proto = cp_model_pb2.CpModelProto()
        proto.ParseFromString(path.read_bytes())
    return proto


def _var(lit: int) -> int:
    return lit if lit >= 0 else -lit - 1


def _shift(domain: tuple[int, ...], by: int) -> list[int]:
    """``domain`` (flattened intervals) minus ``by``, its infinite ends kept infinite."""
    return [b if b in (INT_MIN, INT_MAX) else b - by for b in domain]


class Reducer:
    """Reads a model once (its variables' domains, constraints, objective, and which constraints each variable
    is in) and builds sub-models of it around a solution."""

    def __init__(self, model: cp_model.CpModel) -> None:
        proto = _read(model)
        self.domains = [tuple(v.domain) for v in proto.variables]
        self.cons = [_parse(c) for c in proto.constraints]
        obj = proto.objective
        self.objective = (tuple(obj.vars), tuple(obj.coeffs), obj.offset, obj.scaling_factor or 1.0)
        self.var_cons: list[list[int]] = [[] for _ in self.domains]
        self.globals = []
        for i, c in enumerate(self.cons):
            if c.kind in ("no_overlap", "cumulative"):
                self.globals.append(i)
                continue
            refs = {_var(x) for x in c.enf + c.lits}
            for e in c.exprs:
                refs.update(e[0])
            for v in refs:
                self.var_cons[v].append(i)

    def sub_model(self, solution: list[int], free: list[int],
                  domains: dict[int, tuple[int, int]]) -> tuple[cp_model.CpModel, int]:
        """The model with every variable not in ``free`` (sorted indices) fixed to ``solution``, reduced; its
        variable i is ``free[i]``, taking ``domains`` where given. ``solution`` (feasible for the whole model)
        is the hint, clamped into the new domains. Returns the model and the constraints read and written (a
        measure of the work of building and loading it)."""
        built = _Build(self, solution, free, domains)
        return built.model, built.read + len(built.proto.constraints)


class _Build:
    """One sub-model under construction (see :meth:`Reducer.sub_model`)."""

    def __init__(self, r: Reducer, solution: list[int], free: list[int], domains: dict[int, tuple[int, int]]):
        self.r, self.sol = r, solution
        self.new = {v: i for i, v in enumerate(free)}
        self.model = cp_model.CpModel()
        self.proto = self.model.Proto()
        hint = []
        for v in free:
            lo, hi = domains.get(v, (r.domains[v][0], r.domains[v][-1]))
            self.proto.variables.add().domain.extend([lo, hi] if v in domains else r.domains[v])
            hint.append(min(max(solution[v], lo), hi))
        self.intervals: dict[int, int] = {}  # whole-model interval constraint -> its index here
        todo = sorted({i for v in free for i in r.var_cons[v]})
        self.read = len(todo) + len(r.globals)
        for i in todo:
            self._add(i, r.cons[i])
        for i in r.globals:
            self._add_global(r.cons[i])
        vs, cs, offset, scale = r.objective
        nv, nc, const = self._split((vs, cs, 0))
        self.proto.objective.vars.extend(nv)
        self.proto.objective.coeffs.extend(nc)
        self.proto.objective.offset = offset + const
        self.proto.objective.scaling_factor = scale
        self.proto.solution_hint.vars.extend(range(len(free)))
        self.proto.solution_hint.values.extend(hint)

    def _value(self, lit: int) -> bool:
        return bool(self.sol[lit]) if lit >= 0 else not self.sol[-lit - 1]

    def _lit(self, lit: int) -> int | None:
        """The literal here, or None where it is fixed."""
        v = self.new.get(_var(lit))
        return None if v is None else (v if lit >= 0 else -v - 1)

    def _split(self, e: Expr) -> tuple[list[int], list[int], int]:
        """An expression as its free terms (here) and the constant the fixed ones add to its offset."""
        nv, nc, const = [], [], e[2]
        for v, c in zip(e[0], e[1]):
            if v in self.new:
                nv.append(self.new[v])
                nc.append(c)
            else:
                const += c * self.sol[v]
        return nv, nc, const

    def _enforcement(self, enf: tuple[int, ...]) -> list[int] | None:
        """The free enforcement literals, or None where a fixed one is false (the constraint is off)."""
        out = []
        for lit in enf:
            mapped = self._lit(lit)
            if mapped is not None:
                out.append(mapped)
            elif not self._value(lit):
                return None
        return out

    def _forbid(self, enf: list[int], what: _Con) -> None:
        """The constraint fails on its fixed part: its free enforcement must be off."""
        if not enf:
            raise ValueError(f"submodel: the solution violates {what}")
        self.proto.constraints.add().bool_or.literals.extend([-x - 1 for x in enf])

    def _add(self, index: int, c: _Con) -> None:
        enf = self._enforcement(c.enf)
        if enf is None:
            return
        if c.kind == "linear":
            nv, nc, const = self._split(c.exprs[0])
            if not nv:
                if not any(lo <= const <= hi for lo, hi in zip(c.domain[::2], c.domain[1::2])):
                    self._forbid(enf, c)
                return
            ct = self.proto.constraints.add()
            ct.enforcement_literal.extend(enf)
            ct.linear.vars.extend(nv)
            ct.linear.coeffs.extend(nc)
            ct.linear.domain.extend(_shift(c.domain, const))
        elif c.kind in ("bool_or", "bool_and"):
            lits = [self._lit(x) for x in c.lits]
            fixed = [self._value(x) for x, m in zip(c.lits, lits) if m is None]
            rest = [m for m in lits if m is not None]
            if c.kind == "bool_or" and any(fixed) or c.kind == "bool_and" and all(fixed) and not rest:
                return  # satisfied by its fixed part
            if c.kind == "bool_or" and not rest or c.kind == "bool_and" and not all(fixed):
                self._forbid(enf, c)  # failed by its fixed part
                return
            ct = self.proto.constraints.add()
            ct.enforcement_literal.extend(enf)
            (ct.bool_or if c.kind == "bool_or" else ct.bool_and).literals.extend(rest)
        elif c.kind == "interval":
            self.intervals[index] = len(self.proto.constraints)
            ct = self.proto.constraints.add()
            ct.enforcement_literal.extend(enf)
            for part, e in zip((ct.interval.start, ct.interval.end, ct.interval.size), c.exprs):
                nv, nc, const = self._split(e)
                part.vars.extend(nv)
                part.coeffs.extend(nc)
                part.offset = const
        else:
            raise ValueError(f"submodel: {c.kind} is a global constraint")

    def _fixed_interval(self, index: int, solved: bool = False) -> tuple[int, int] | None:
        """[start, end) of a fixed interval (with ``solved``, of any interval in the solution) if present."""
        c = self.r.cons[index]
        if not all(self._value(x) for x in c.enf):
            return None
        if solved:
            return tuple(e[2] + sum(k * self.sol[v] for v, k in zip(e[0], e[1])) for e in c.exprs[:2])
        start, end = (self._split(e)[2] for e in c.exprs[:2])
        return start, end

    def _constant_interval(self, start: int, end: int) -> int:
        ct = self.proto.constraints.add()
        ct.interval.start.offset, ct.interval.end.offset, ct.interval.size.offset = start, end, end - start
        return len(self.proto.constraints) - 1

    def _add_global(self, c: _Con) -> None:
        if c.enf:
            raise ValueError(f"submodel: an enforced {c.kind} is not handled")
        free = [(k, i) for k, i in enumerate(c.intervals) if i in self.intervals]
        fixed = [(k, span) for k, i in enumerate(c.intervals) if i not in self.intervals
                 for span in [self._fixed_interval(i)] if span is not None and span[1] > span[0]]
        if c.kind == "no_overlap":
            runs: list[list[int]] = []
            for _, (a, b) in sorted(fixed, key=lambda x: x[1]):
                if runs and a <= runs[-1][1]:
                    runs[-1][1] = max(runs[-1][1], b)
                else:
                    runs.append([a, b])
            members = [self.intervals[i] for _, i in free] + [self._constant_interval(a, b) for a, b in runs]
            self.proto.constraints.add().no_overlap.intervals.extend(members)
            return
        capacity = self._split(c.exprs[0])
        if capacity[0]:
            raise ValueError("submodel: a cumulative with a variable capacity is not handled")
        cap = capacity[2]
        demands = [self._split(d) for d in c.exprs[1:]]
        reach = sum(d[2] if not d[0] else cap for d in (demands[k] for k, _ in free))  # free usage at most
        usage: dict[int, int] = {}
        for k, (a, b) in fixed:
            usage[a] = usage.get(a, 0) + demands[k][2]
            usage[b] = usage.get(b, 0) - demands[k][2]
        members = [self.intervals[i] for _, i in free]
        loads = [demands[k] for k, _ in free]
        held: dict[int, int] = {}  # the solution's usage by the free intervals
        for k, i in free:
            span = self._fixed_interval(i, solved=True)
            if span is not None:
                held[span[0]] = held.get(span[0], 0) + demands[k][2]
                held[span[1]] = held.get(span[1], 0) - demands[k][2]
        segs = []
        level, own, prev = 0, 0, None
        for t in sorted(set(usage) | set(held)):
            if prev is not None and level > 0 and level + reach > cap:  # [prev, t) at ``level``: it can bind
                segs.append([prev, t, level, level, own])
            level, own, prev = level + usage.get(t, 0), own + held.get(t, 0), t
        runs: list[list[int]] = []
        for a, b, lev, low, own in segs:  # merge neighbours within PROFILE_SLACK x cap, the solution still fitting
            if runs:
                r = runs[-1]
                top, bottom, most = max(r[2], lev), min(r[3], low), max(r[4], own)
                if r[1] == a and top - bottom <= PROFILE_SLACK * cap and top + most <= cap:
                    r[1:] = [b, top, bottom, most]
                    continue
            runs.append([a, b, lev, low, own])
        for a, b, lev, _, _ in runs:
            members.append(self._constant_interval(a, b))
            loads.append(([], [], lev))
        ct = self.proto.constraints.add()  # added after its constant intervals: a reference into the list
        ct.cumulative.intervals.extend(members)
        ct.cumulative.capacity.offset = cap
        for nv, nc, const in loads:
            d = ct.cumulative.demands.add()
            d.vars.extend(nv)
            d.coeffs.extend(nc)
            d.offset = const
