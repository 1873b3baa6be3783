"""The sharding vocabulary (sharding types, compute kernels) and the syntax of the
`--sharding_type` and `--compute_kernel` flags (`sharding_plans.types.ShardingFlags`).

Both flags take either one value for every table (``row_wise``) or per-table
assignments (``t_cat_0=row_wise,t_cat_3=table_wise``), or both (a default first:
``table_wise,t_cat_0=row_wise``). The planner then only considers the given
choices for each table.
"""

from collections.abc import Sequence

from common.config_flags import FlagError

SHARDING_TYPES = (
    "data_parallel",
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
)
COMPUTE_KERNELS = ("dense", "fused", "fused_uvm", "fused_uvm_caching")
# What torchrec's sharder offers on CPU; the row splits run on CPU too (see
# `sharding_plans.sharders`) but the planner is only given them when asked for.
CPU_SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "table_column_wise")
ROW_SHARDING_TYPES = ("row_wise", "table_row_wise")
COLUMN_SHARDING_TYPES = ("column_wise", "table_column_wise")
CUDA_ONLY_KERNELS = ("fused_uvm", "fused_uvm_caching")
# Compute kernels without an embedding cache: dense (data parallel) and FBGEMM's
# fused kernels in HBM or UVM. The others (fused_uvm_caching, key_value, the virtual
# tables) keep rows in a cache that prefetches and forwards fill.
UNCACHED_KERNELS = ("dense", "fused", "fused_uvm")
# What an EmbeddingCollection table (the item table of a history, --sequence_columns)
# may take: torchrec's sharder offers no table_row_wise or table_column_wise for it, and
# its data_parallel lookup is left out (sharding_plans/sharders.py).
SEQUENCE_SHARDING_TYPES = ("table_wise", "row_wise", "column_wise")
# Every sharding type but data_parallel: these run the fused FBGEMM kernels.
FUSED_SHARDING_TYPES = tuple(t for t in SHARDING_TYPES if t != "data_parallel")
# torchrec keeps column shards at least this wide unless told otherwise.
TORCHREC_MIN_COLUMN_SHARD = 32
ALL_TABLES = "*"


def check_table_precision(table: str, sharding_type: str | None, precision: str, source: str) -> None:
    """Raises FlagError (one line starting with ``source``) for an fp16 table that is
    data-parallel: FBGEMM's dense kernel has no fp16 backward, its updates are wrong."""
    if precision == "fp16" and sharding_type == "data_parallel":
        raise FlagError(
            f"{source}: table {table} is data_parallel with fp16 weights, and FBGEMM's dense "
            "kernel has no fp16 backward (its updates are wrong): give it a fused sharding "
            "type, or keep fp32 tables"
        )


def parse_table_choices(text: str, flag: str, choices: Sequence[str]) -> dict[str, str]:
    """Parses ``VALUE`` / ``TABLE=VALUE,...`` / ``VALUE,TABLE=VALUE,...``.

    Returns {table or "*": value}. Raises FlagError naming the flag on an empty item,
    a repeated table or a value not in ``choices``.

    Example::

        parse_table_choices("table_wise,t_cat_0=row_wise", "--sharding_type", SHARDING_TYPES)
        # {"*": "table_wise", "t_cat_0": "row_wise"}
    """
    result: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise FlagError(f"{flag}: malformed list {text!r}: empty item")
        table, sep, value = item.rpartition("=")
        table = table.strip() if sep else ALL_TABLES
        value = value.strip()
        if sep and not table:
            raise FlagError(f"{flag}: malformed item {item!r}: expected TABLE=VALUE")
        if value not in choices:
            raise FlagError(f"{flag}: unknown value {value!r} (choose from {', '.join(choices)})")
        if table in result:
            what = "a default for every table" if table == ALL_TABLES else f"table {table}"
            raise FlagError(f"{flag}: {what} is given twice in {text!r}")
        result[table] = value
    return result
