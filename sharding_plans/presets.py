"""The published TorchRec DLRM configurations, runnable by name.

Table sizes, GPU counts and batch sizes are those of the public TorchRec DLRM
example's results table (Criteo 1TB, embedding dim 128, A100 40 GB GPUs in hosts of
8): MLPerf (97.36 GiB of tables), MLPerfx2 (174.03 GiB) and Full Size (420.94 GiB).
Host memory per GPU is that of the p4d.24xlarge hosts it ran on (1152 GiB / 8), so
a plan does not depend on the machine it is made on. Their plans are checked in
beside this file (`presets/<name>.json`) and re-planned by the tests.
"""

import os
from dataclasses import dataclass

from common.errors import BadInput

PRESET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")

_MLPERF_SIZES = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)
_MLPERF_X2_SIZES = (
    80000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 80000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 80000000, 40790948, 80000000, 590152, 12973, 108, 36,
)
_FULL_SIZE_SIZES = (
    227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36,
)


@dataclass(frozen=True)
class Preset:
    """One published configuration.

    Args:
        name: what the CLI calls it (``--preset mlperf``).
        title: its name in the published table.
        num_embeddings_per_feature: rows of the 26 tables.
        world_size: GPUs.
        batch_size: rows per GPU per step.
        embedding_dim: width of every table.
        local_world_size: GPUs per host.
        hbm_gb: GiB of memory per GPU.
        ddr_gb: GiB of host memory per GPU.

    Example::

        PRESETS["mlperf"].plan_path
    """

    name: str
    title: str
    num_embeddings_per_feature: tuple[int, ...]
    world_size: int
    batch_size: int
    embedding_dim: int = 128
    local_world_size: int = 8
    hbm_gb: float = 40.0
    ddr_gb: float = 144.0

    @property
    def plan_path(self) -> str:
        """The checked-in plan of this preset."""
        return os.path.join(PRESET_DIR, f"{self.name}.json")


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("mlperf", "MLPerf", _MLPERF_SIZES, world_size=8, batch_size=8192),
        Preset("mlperfx2", "MLPerfx2", _MLPERF_X2_SIZES, world_size=16, batch_size=4096),
        Preset("full_size", "Full Size", _FULL_SIZE_SIZES, world_size=80, batch_size=819),
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
