"""Sharding plans: the planner for the real hardware, plan files, dry runs and reports."""

import importlib
from typing import Any

# Where each public name lives. Loaded on first use, so that importing
# sharding_plans.constraints (the flags) does not load torchrec: the entry points
# answer --help before it.
_PUBLIC = {
    "PlanDoesNotFit": "sharding_plans.planner",
    "PlannerConfig": "sharding_plans.planner",
    "ShardingConstraints": "sharding_plans.constraints",
    "build_sharders": "sharding_plans.sharders",
    "build_sharding_plan": "sharding_plans.planner",
    "build_topology": "sharding_plans.planner",
    "format_sharding_plan": "sharding_plans.report",
    "plan_summary": "sharding_plans.report",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
