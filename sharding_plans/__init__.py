"""Sharding plans: the planner for the real hardware and plan printing."""

from sharding_plans.planner import PlannerConfig, build_sharding_plan, build_topology
from sharding_plans.report import format_sharding_plan, plan_summary

__all__ = ["PlannerConfig", "build_sharding_plan", "build_topology", "format_sharding_plan", "plan_summary"]
