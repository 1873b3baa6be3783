"""Sharding plans: the planner for the real hardware, plan files, dry runs and reports."""

from sharding_plans.constraints import ShardingConstraints
from sharding_plans.planner import PlanDoesNotFit, PlannerConfig, build_sharding_plan, build_topology
from sharding_plans.report import format_sharding_plan, plan_summary
from sharding_plans.sharders import build_sharders

__all__ = [
    "PlanDoesNotFit",
    "PlannerConfig",
    "ShardingConstraints",
    "build_sharders",
    "build_sharding_plan",
    "build_topology",
    "format_sharding_plan",
    "plan_summary",
]
