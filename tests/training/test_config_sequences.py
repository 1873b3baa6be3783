"""The training config's refusals for a model with histories (--sequence_columns)."""

import pytest

from sharding_plans.sharders import build_sharders
from training.flags import parse_config


@pytest.mark.parametrize("sharding", ["data_parallel", "t_cat_3=data_parallel,table_wise"])
def test_an_item_table_cannot_be_data_parallel(sharding, capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(["--sequence_columns", "h3:cat_3", "--sharding_type", sharding], "dlrm_main.py", "")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "dlrm_main.py: error: --sharding_type: table t_cat_3 serves the history h3 (--sequence_columns) and "
        "cannot be data_parallel: give it table_wise, row_wise or column_wise (t_cat_3=table_wise,...)"
    ]


def test_the_planner_is_never_offered_a_data_parallel_item_table():
    from torchrec.modules.embedding_modules import EmbeddingCollection

    (sharder,) = [s for s in build_sharders() if s.module_type is EmbeddingCollection]
    assert "data_parallel" not in sharder.sharding_types("cpu")
    assert {"table_wise", "row_wise", "column_wise"} <= set(sharder.sharding_types("cpu"))


def test_other_tables_may_still_be_data_parallel():
    config = parse_config(
        ["--sequence_columns", "h3:cat_3", "--sharding_type", "t_cat_3=row_wise,data_parallel"], "dlrm_main.py", ""
    )
    assert config.model.sequences == [("h3", "cat_3")] and config.model.max_history == 20
