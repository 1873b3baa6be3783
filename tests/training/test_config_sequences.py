"""The training config's refusals for a model with histories (--sequence_columns)."""

import pytest

from common.errors import BadInput
from sharding_plans.constraints import SEQUENCE_SHARDING_TYPES
from sharding_plans.sharders import build_sharders
from training.flags import parse_config
from training.pipelines import check_validation_handover


@pytest.mark.parametrize(
    "sharding, refused",
    [
        ("data_parallel", "data_parallel"),
        ("t_cat_3=data_parallel,table_wise", "data_parallel"),
        # The EmbeddingCollection sharder has no table splits: the planner failed with a traceback.
        ("table_row_wise", "table_row_wise"),
        ("t_cat_3=table_column_wise,row_wise", "table_column_wise"),
    ],
)
def test_an_item_table_takes_only_what_an_embedding_collection_shards(sharding, refused, capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(["--sequence_columns", "h3:cat_3", "--sharding_type", sharding], "dlrm_main.py", "")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "dlrm_main.py: error: --sharding_type: table t_cat_3 serves the history h3 (--sequence_columns) and "
        f"cannot be {refused}: give it table_wise, row_wise or column_wise (t_cat_3=table_wise,...)"
    ]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_planner_is_offered_exactly_the_item_tables_sharding_types(device):
    """What the flags let an item table take is what its sharder offers (data_parallel left out)."""
    from torchrec.modules.embedding_modules import EmbeddingCollection

    (sharder,) = [s for s in build_sharders() if s.module_type is EmbeddingCollection]
    assert sorted(sharder.sharding_types(device)) == sorted(SEQUENCE_SHARDING_TYPES)


def test_other_tables_may_still_be_data_parallel():
    config = parse_config(
        ["--sequence_columns", "h3:cat_3", "--sharding_type", "t_cat_3=row_wise,data_parallel"], "dlrm_main.py", ""
    )
    assert config.model.sequences == [("h3", "cat_3")] and config.model.max_history == 20


def test_validation_inside_the_epoch_on_several_ranks_is_refused_under_a_holding_pipeline():
    """torchrec 1.8's handover to validation resends the held batch's history ids (the
    matrix found a gloo all-to-all size mismatch, or a hang): one line, before training.
    One rank, the base pipeline, epoch-end validation and models without histories run."""
    with pytest.raises(BadInput) as e:
        check_validation_handover("sparse_dist", 2, histories=True, within_epoch=True)
    assert str(e.value) == (
        "--validation_freq_within_epoch with --sequence_columns on 2 ranks: the sparse_dist pipeline's "
        "handover to validation resends the held batch's history ids (torchrec 1.8), and the ranks' "
        "all-to-all sizes disagree; validate at the epoch's end (no --validation_freq_within_epoch) "
        "or use --pipeline base"
    )
    for allowed in (("sparse_dist", 1, True, True), ("base", 2, True, True), ("sparse_dist", 2, False, True)):
        check_validation_handover(*allowed)
    check_validation_handover("prefetch", 8, histories=True, within_epoch=False)


def test_validation_inside_the_epoch_of_zch_on_several_ranks_is_refused_as_a_historys():
    """zch's managed-collision modules size their all-to-all by the ids sent too: the
    correctness matrix found the same gloo failure at the handover."""
    with pytest.raises(BadInput) as e:
        check_validation_handover("sparse_dist", 2, histories=False, within_epoch=True, zch=True)
    assert str(e.value).startswith(
        "--validation_freq_within_epoch with --id_hashing zch on 2 ranks: the sparse_dist pipeline's "
        "handover to validation resends the held batch's ids (torchrec 1.8)"
    )
    check_validation_handover("base", 2, histories=False, within_epoch=True, zch=True)
    check_validation_handover("sparse_dist", 1, histories=False, within_epoch=True, zch=True)
