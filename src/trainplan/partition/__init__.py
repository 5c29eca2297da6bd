"""Pipeline partitioning (seed 003 steps 2, 9-12) and load balance (steps 7-8).

Public API: :func:`pipeline_graph` (validated pipeline view of a profiled graph), :func:`range_tables`,
:func:`partition_graph` (min-max split + boundary refinement), :func:`min_max_cuts` (exact DP),
:func:`refine_cuts`, :func:`stage_stats`, :func:`balance` (schedule, rate, re-partition, DP comparison),
:func:`plan_dict`, :func:`iterations_dict`, :class:`PartitionError`. Other partition methods (blocks split evenly,
DeepSpeed's, the exact DP) over the model's layers: :mod:`~trainplan.partition.methods`,
:mod:`~trainplan.partition.layers`.
"""

from trainplan.partition.balance import Balanced, BalanceSettings, balance, iterations_dict, plan_dict
from trainplan.partition.errors import PartitionError
from trainplan.partition.graph import PipelineGraph, pipeline_graph
from trainplan.partition.memory_limit import MemoryLimit, in_flight
from trainplan.partition.partition import Partition, partition_from_dict, partition_graph
from trainplan.partition.pipeline import PipelineMetrics, pipeline_metrics
from trainplan.partition.refine import refine_cuts, total_boundary_bytes
from trainplan.partition.schedule_cache import StageScheduler
from trainplan.partition.split import min_max_cuts
from trainplan.partition.stages import StageStats, stage_stats
from trainplan.partition.tables import RangeTables, range_tables
from trainplan.schedule.budgeted_stages import SolverSettings

__all__ = [
    "BalanceSettings",
    "Balanced",
    "MemoryLimit",
    "Partition",
    "PartitionError",
    "PipelineGraph",
    "PipelineMetrics",
    "RangeTables",
    "SolverSettings",
    "StageScheduler",
    "StageStats",
    "balance",
    "in_flight",
    "iterations_dict",
    "min_max_cuts",
    "partition_from_dict",
    "partition_graph",
    "pipeline_graph",
    "pipeline_metrics",
    "plan_dict",
    "range_tables",
    "refine_cuts",
    "stage_stats",
    "total_boundary_bytes",
]
