"""The tuning of the scheduler's portfolio (``schedule/portfolio.py``): one frozen object, every value in one place.

Shares are fractions of the call's time limit T; rates turn work units into seconds of it, so that a step's share
is the same amount of work on any machine (the wall clock is only a safety net, see ``wall_safety``). The rates
were fitted on a 2-core development machine; the measurements behind them belong in ``bench/results/``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class PortfolioSettings:
    """Every tuning constant of the portfolio; what each one trades off.

    Time shares (of the limit T):

    * ``deadline_share``: every step of a call stops by this share of T; the rest covers the final replay,
      writing the schedule and CP-SAT's stop latency. Higher: more search, more risk of overrunning T.
    * ``heuristic_share``: once a fast schedule is valid, no new greedy variant starts after this share of T, and
      the DTR-style plan's restarts and refinement are sized by it. Higher: better first schedules, less time for
      the bounds and CP-SAT.
    * ``no_heuristic_share``: with the bisection on, the share of T the requested budget keeps when no fast schedule
      fits (the budget looks infeasible); the rest goes to the bisection. Lower: the bisection gets more, but a
      first schedule that comes late (a slow plan on a large graph) is lost to a raised budget.
    * ``bisect_share``: the share of what is left after a failed attempt that the bisection's probes may use; the
      rest is the final run's at the found budget.
    * ``mip_min_share``: the full CP-SAT model runs only if this share of T is left (or nothing was found yet);
      below it, building a big model risks overrunning the limit for little gain.
    * ``restricted_share``, ``restricted_max_s``: CP-SAT restricted to the relaxation's evicted ops gets at most
      this share of T and at most this many seconds. Where the restriction works it ends in well under a second;
      where it does not, its time is better spent by window LNS.
    * ``staged_share``: the staged bound before CP-SAT (one worker, or no usable hint) gets at most this share of T;
      beside CP-SAT (2+ workers, deterministic) both get all that is left.
    * ``guided_share``, ``guided_max_s``: the relaxation-guided greedy run is abandoned after this share of T or
      this many seconds, whichever comes first: it ends at once where it works and rarely beats the fast schedules.
    * ``probe_share``: CP-SAT's limit in one bisection probe where no fast schedule fits; with ``max_mip_probes``
      (a fixed count, so the bisection stays deterministic) it trades the probes' reach against the final run.
    * ``lns_share``: the share of a hinted CP-SAT run given to window LNS (the rest to CP-SAT's own search).

    Work rates (units per second of T, deterministic charges):

    * ``scratch_work_per_second``: recomputing from scratch; its cap is this x the heuristics' share (or the
      bisection's allowance). Higher: it meets more budgets near its bound, a failed run takes more of the limit.
    * ``search_work_per_second``, ``probe_search_share``: the last-compute search, capped like the run from scratch;
      in a bisection probe at most ``probe_search_share`` of the allowance left (near the floor it decides small
      graphs; on large ones a probe's search would spend what the DTR-style probes need).
    * ``probe_greedy_work_per_op``, ``probe_greedy_per_second``: a probe's greedy run is capped at this many work
      units per op (runs that meet a budget need far fewer than failing ones) and charged at this rate.
    * ``probe_dtr_per_second``: a probe's DTR-style plans (and the raised plan) are charged at this rate.
    * ``dtr_ops_per_second``, ``dtr_max_restarts``: the DTR-style plan gets min(``dtr_max_restarts``, heuristics'
      share x this rate / n) randomised restarts: a function of the limit and the size only.
    * ``refine_share``, ``refine_work_per_second``: ruin and recreate on the DTR-style plan does this share of the
      heuristics' time x this rate of work units; ``refine_large_share`` instead on graphs with more than
      ``refine_large_edges`` input edges, where window LNS gains little and ruin and recreate more.
    * ``staged_variables_per_second``: the staged bound runs only if its model has at most this many variables
      per second of T; beyond, its bound rarely passes the relaxation's.

    Bisection:

    * ``bisect_tolerance``: the bisection stops when the budgets it brackets are this close (a share of the upper
      one). Smaller: a tighter raised budget, more probes.
    * ``bisect_split``: the first probe sits this far up from the floor to the plain peak (a failed probe is the
      slow one; at the midpoint the first probe could spend the whole share failing).
    * ``raise_step``: the raised plan's least raise, a share of the budget it starts from (a fifth of the
      tolerance: finer raises cost more plans).

    Steps and hints:

    * ``grow_min_s``: CP-SAT optimal within its grid runs again on a larger grid if this many seconds are left.
    * ``min_step_s``: a step (relaxation, CP-SAT run, staged bound) starts only with at least this much time left.
    * ``min_limit_s``: the least limit a step is handed (a CP-SAT run, the final run after a bisection).
    * ``hint_max_over_bound``, ``hint_max_growth``: CP-SAT gets the incumbent as a hint only if it takes at most
      this many times the lower bound and fitting it grows the model at most this many times; a poor hint holds
      CP-SAT near it (from scratch it often does better).
    * ``wall_safety``: a deterministic step's wall-clock cap, as a multiple of its charged share: the safety net on
      a slower or busier machine (hit, it makes the answer depend on the machine).
    """

    deadline_share: float = 0.9
    heuristic_share: float = 0.3
    no_heuristic_share: float = 0.5
    bisect_share: float = 0.5
    mip_min_share: float = 0.2
    restricted_share: float = 0.25
    restricted_max_s: float = 3.0
    staged_share: float = 0.3
    guided_share: float = 0.2
    guided_max_s: float = 2.0
    probe_share: float = 0.05
    max_mip_probes: int = 4
    lns_share: float = 0.5
    scratch_work_per_second: int = 800_000
    search_work_per_second: int = 800_000
    probe_search_share: float = 0.2
    probe_greedy_work_per_op: int = 200
    probe_greedy_per_second: int = 190_000
    probe_dtr_per_second: int = 4_500_000
    dtr_ops_per_second: int = 2000
    dtr_max_restarts: int = 8
    refine_share: float = 0.5
    refine_work_per_second: int = 3_000_000
    refine_large_edges: int = 4000
    refine_large_share: float = 2.0
    staged_variables_per_second: int = 2000
    bisect_tolerance: float = 0.005
    bisect_split: float = 0.75
    raise_step: float = 0.001
    grow_min_s: float = 1.0
    min_step_s: float = 0.05
    min_limit_s: float = 0.1
    hint_max_over_bound: float = 2.0
    hint_max_growth: float = 2.0
    wall_safety: float = 2.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"PortfolioSettings.{f.name} must be a number >= 0, got {value!r}")


DEFAULTS = PortfolioSettings()
