"""The published TorchRec DLRM configurations, runnable by name: each a recipe plus a topology.

The recipes (`recipes.MLPERF`, ...) hold what the public TorchRec DLRM example's
results table trained (Criteo 1TB: table sizes, embedding dim 128, batch per GPU);
the topology here holds what it ran on: A100 40 GB GPUs in hosts of 8, and the host
memory per GPU of the p4d.24xlarge hosts (1152 GiB / 8), so that a plan does not
depend on the machine it is made on. ``plan --preset mlperf`` is ``plan --recipe
mlperf`` with these topology flags. Their plans are checked in beside this file
(`presets/<name>.json`) and re-planned by the tests.
"""

from common.errors import BadInput
from recipes import FULL_SIZE, MLPERF, MLPERF_X2
from sharding_plans.types import Preset, TopologyFlags


def _a100_40gb(world_size: int) -> TopologyFlags:
    return TopologyFlags(world_size=world_size, local_world_size=8, compute_device="cuda", hbm_gb=40.0, ddr_gb=144.0)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("mlperf", "MLPerf", MLPERF, _a100_40gb(8)),
        Preset("mlperfx2", "MLPerfx2", MLPERF_X2, _a100_40gb(16)),
        Preset("full_size", "Full Size", FULL_SIZE, _a100_40gb(80)),
    )
}


def find_preset(name: str) -> Preset:
    """A preset by name, ignoring case and accepting spaces for underscores ("Full Size").

    Raises BadInput listing the names when there is no such preset.
    """
    key = name.strip().lower().replace(" ", "_").replace("-", "_")
    if key not in PRESETS:
        raise BadInput(f"--preset: unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return PRESETS[key]
