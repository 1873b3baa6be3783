"""Zero-collision tables (models/zch.py, sharding_plans/zch.py): torchrec's managed-collision
modules, unsharded in process and row-wise over 2 gloo ranks (tests/support/zch_ranks.py)."""

import sys

import numpy as np
import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from data.parquet.id_hashing import ZCH_ID_RANGE, hashed, integer_keys, string_keys, zch_ids
from harness.launch import launch
from models.zch import (
    ZchOptions,
    ZchPooledEmbeddings,
    build_zch_collection,
    reserve_history,
    zch_summary,
    zch_unavailable,
)
from tests.support import zch_ranks

ROWS = 4  # 3 rows for admitted ids, the last the default row


def _model(policy: str = "lfu", interval: int = 1) -> ZchPooledEmbeddings:
    torch.manual_seed(0)
    configs = [EmbeddingBagConfig(name="t_user", embedding_dim=2, num_embeddings=ROWS, feature_names=["user"])]
    model = ZchPooledEmbeddings(build_zch_collection(configs, ZchOptions(policy, interval), torch.device("cpu")))
    reserve_history(model.collection, 8)
    return model


def _ids(*values: int) -> KeyedJaggedTensor:
    ids = torch.from_numpy(zch_ids(integer_keys(np.array(values)), seed=0))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["user"], values=ids, lengths=torch.ones(len(values), dtype=torch.int32)
    )


def _rows(model: ZchPooledEmbeddings, *values: int) -> list[int]:
    module = model.collection._managed_collision_collection._managed_collision_modules["t_user"]
    kjt, training = _ids(*values), module.training
    module.eval()  # a lookup that admits nothing
    rows = module({"t_user": kjt["user"]})["t_user"].values().tolist()
    module.train(training)
    return rows


def test_zch_ids_are_the_hash_without_its_last_bit_below_the_empty_slot_mark():
    keys = string_keys(np.frombuffer(b"ab", dtype=np.uint8), np.array([0, 1, 2]))
    ids = zch_ids(keys, seed=3)
    assert ids.dtype == np.int64
    assert ids.tolist() == [int(h) >> 1 for h in hashed(keys, 3)]
    assert (ids >= 0).all() and (ids < ZCH_ID_RANGE).all()


def test_unknown_ids_read_the_default_row_and_count_as_collisions_until_admitted():
    model = _model(interval=2)  # admits at every second step, before its lookups
    assert _rows(model, 7, 8) == [ROWS - 1, ROWS - 1]  # nothing admitted yet
    model.train()
    model(_ids(7, 7, 8))  # no admission at this step: 3 lookups of the default row
    report = model.statistics.report(model.collection)["user"]
    assert (report.live_ids, report.admitted, report.evicted, report.lookups, report.collisions) == (0, 0, 0, 3, 3)
    model(_ids(7, 9))  # admits 7, 8 and 9, then reads them
    report = model.statistics.report(model.collection)["user"]
    assert (report.live_ids, report.admitted, report.evicted, report.lookups, report.collisions) == (3, 3, 0, 2, 0)
    rows = _rows(model, 7, 8, 9, 10)
    assert rows[3] == ROWS - 1 and len(set(rows[:3])) == 3 and ROWS - 1 not in rows[:3]  # 10 is unknown
    model(_ids(10, 7))
    report = model.statistics.report(model.collection)["user"]
    assert (report.lookups, report.collisions, report.admitted) == (2, 1, 0)
    assert zch_summary({"user": report}) == "zch user: live 3 +0 -0 collisions 50.00%"


def test_evaluation_never_admits():
    model = _model()
    model.eval()
    with torch.no_grad():
        model(_ids(7, 8))
    assert _rows(model, 7, 8) == [ROWS - 1, ROWS - 1]
    assert model.statistics.report(model.collection)["user"].live_ids == 0


@pytest.mark.parametrize("policy, kept", [("lfu", {1, 2, 3}), ("lru", {4, 5, 6})])
def test_a_full_table_evicts_by_the_policy_and_evicted_ids_read_the_default_row(policy, kept):
    model = _model(policy)
    model.train()
    model(_ids(1, 1, 2, 2, 3, 3))  # admitted, twice each
    model.statistics.report(model.collection)
    model(_ids(4, 5, 6))  # once each: LFU keeps 1-3, LRU takes 4-6
    report = model.statistics.report(model.collection)["user"]
    assert report.live_ids == 3
    assert (report.admitted, report.evicted) == ((0, 0) if policy == "lfu" else (3, 3))
    rows = dict(zip(range(1, 7), _rows(model, 1, 2, 3, 4, 5, 6)))
    assert {i for i, r in rows.items() if r != ROWS - 1} == kept


def test_a_step_with_more_ids_than_the_record_holds_grows_it_instead_of_dropping_ids():
    torch.manual_seed(0)
    configs = [EmbeddingBagConfig(name="t_user", embedding_dim=2, num_embeddings=64, feature_names=["user"])]
    model = ZchPooledEmbeddings(build_zch_collection(configs, ZchOptions("lfu", 2), torch.device("cpu")))
    reserve_history(model.collection, 2)  # room for 2 ids a step: torchrec would keep 5 of the 40 below
    model.train()
    model(_ids(*range(10)))
    model(_ids(*range(10, 40)))  # the admission: every id of both steps
    assert model.statistics.report(model.collection)["user"].live_ids == 40
    assert ROWS - 1 not in _rows(model, 0, 39) and 63 not in _rows(model, 0, 39)


def test_bad_options_get_one_line():
    with pytest.raises(ValueError, match=r"^--zch_eviction_policy 'lifo': choose one of lfu, lru$"):
        ZchOptions("lifo", 1).check()
    with pytest.raises(ValueError, match=r"^--zch_eviction_interval 0: must be at least 1 step$"):
        ZchOptions("lfu", 0).check()


def test_a_torchrec_without_managed_collision_modules_is_named(monkeypatch):
    assert zch_unavailable() is None
    monkeypatch.setitem(sys.modules, "torchrec.modules.mc_modules", None)
    reason = zch_unavailable()
    assert reason is not None and reason.startswith("--id_hashing zch needs torchrec's managed-collision modules")
    assert "\n" not in reason


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["lfu"])  # lru: the same, run by hand (docs/zch.md)
def test_two_ranks_row_wise_resume_equals_uninterrupted_and_reshards_to_one(tmp_path, policy):
    results = launch(zch_ranks.main, [policy, str(tmp_path)], nproc=2)
    for rank, result in results.items():
        assert result["resumed_losses"] == result["losses"], rank
        assert result["state_difference"] == 0.0, rank
        assert all(live == 14 for live in result["live"].values())  # 2 shards of 8 rows, each less its default row
        assert result["evicted"] > 0 and result["admitted"] > 28
    assert results[0]["resharded_ids"] > 0
    assert results[0]["resharded_wrong_rows"] == 0
