"""Sharding plans: the planner for the real hardware, plan files, dry runs and reports."""

from common.lazy_exports import lazy_exports

# Where each public name lives. Loaded on first use, so that importing
# sharding_plans.types (the flags among them) does not load torchrec: the entry points
# answer --help before it.
__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "PlanDoesNotFit": "sharding_plans.types",
        "PlannerConfig": "sharding_plans.types",
        "ShardingConstraints": "sharding_plans.types",
        "build_sharders": "sharding_plans.sharders",
        "build_sharding_plan": "sharding_plans.planner",
        "build_topology": "sharding_plans.planner",
        "format_sharding_plan": "sharding_plans.report",
        "plan_summary": "sharding_plans.report",
    },
)
