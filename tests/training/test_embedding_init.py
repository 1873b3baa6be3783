"""The seeded table initialisation: values a pure function of (seed, table, row, column)
whatever the threads, pieces and precision; TorchRec's distribution; bounded memory;
TorchRec's own initialisation skipped while sharding."""

import math
import tracemalloc

import numpy as np
import pytest
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan

import training.embedding_init as embedding_init
from sharding_plans import build_sharders
from training.embedding_init import init_embedding_tables, table_values, torchrec_table_init_skipped

SIZES = {"a": (3500, 16), "b": (777, 24)}


def _tables() -> nn.Module:
    model = nn.Module()
    model.tables = nn.ModuleDict({name: nn.Embedding(rows, dim) for name, (rows, dim) in SIZES.items()})
    return model


def _weights(model: nn.Module) -> dict:
    return {name: m.weight.detach().clone() for name, m in model.tables.items()}


def test_values_do_not_depend_on_threads_or_task_size(monkeypatch):
    """1 thread, 3 threads, and tasks of about 1000 or 7 rows write identical tables."""
    runs = []
    for threads, task_values in ((1, 16000), (3, 16000), (3, 112), (2, 1 << 17)):
        monkeypatch.setattr(embedding_init, "TASK_VALUES", task_values)
        model = _tables()
        assert init_embedding_tables(model, SIZES, seed=11, threads=threads) == 2
        runs.append(_weights(model))
    for run in runs[1:]:
        for name in SIZES:
            assert torch.equal(run[name], runs[0][name]), name
    assert not torch.equal(runs[0]["a"][:10, :16], runs[0]["b"][:10, :16])  # tables differ


def test_a_piece_holds_the_tables_values_at_its_offset(monkeypatch):
    """A column piece (tasks of 2000 rows of 8) starting mid-task, in fp16, and a row piece hold exactly the
    whole table's values there (rounded once for fp16)."""
    monkeypatch.setattr(embedding_init, "TASK_VALUES", 16000)  # 1000 rows of 16
    rows, dim, seed = 3500, 16, 1
    table = table_values(seed, 0, rows, (0, rows), (0, dim))
    key, bound = embedding_init.table_key(seed, 0), (1 / rows) ** 0.5
    column_piece = torch.empty(1700, 8, dtype=torch.float16)
    embedding_init._run_tasks(embedding_init._piece_tasks(column_piece, key, bound, 1500, 4), threads=2)
    assert torch.equal(column_piece, table[1500:3200, 4:12].half())
    row_piece = torch.empty(1234, dim)
    embedding_init._run_tasks(embedding_init._piece_tasks(row_piece, key, bound, 2266, 0), threads=2)
    assert torch.equal(row_piece, table[2266:])


def test_values_are_uniform_in_torchrecs_range():
    """Uniform in +-sqrt(1/rows): bounds, mean, standard deviation, no correlation
    between neighbouring rows or columns, and seeds give different tables."""
    rows, dim = 20000, 32
    bound = math.sqrt(1 / rows)
    values = table_values(3, 5, rows, (0, rows), (0, dim)).double()
    assert values.abs().max() <= bound and values.abs().max() > 0.9999 * bound
    assert abs(values.mean()) < 0.005 * bound
    assert values.std() == pytest.approx(bound / math.sqrt(3), rel=0.005)
    counts = torch.histc(values, bins=20, min=-bound, max=bound)
    assert counts.min() > 0.97 * values.numel() / 20 and counts.max() < 1.03 * values.numel() / 20
    for a, b in ((values[:, :-1], values[:, 1:]), (values[:-1], values[1:])):
        assert abs(np.corrcoef(a.flatten().numpy(), b.flatten().numpy())[0, 1]) < 0.01
    other_seed = table_values(4, 5, rows, (0, 100), (0, dim)).double()
    assert abs(np.corrcoef(values[:100].flatten().numpy(), other_seed.flatten().numpy())[0, 1]) < 0.05


def test_init_writes_into_the_shard_without_a_second_copy(monkeypatch):
    """The largest memory the init takes beside the tables is a few tasks' worth of
    scratch, not a copy of a table (UVM and large shards would not fit twice)."""
    monkeypatch.setattr(embedding_init, "TASK_VALUES", 16000)  # 1000 rows of 16
    rows, dim = 20000, 16
    model = nn.Module()
    model.tables = nn.ModuleDict({"t": nn.Embedding(rows, dim)})
    tracemalloc.start()
    try:
        init_embedding_tables(model, {"t": (rows, dim)}, seed=2, threads=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    table_bytes = rows * dim * 4
    assert peak < 0.25 * table_bytes, peak  # 3 scratch arrays of 1000 x 16 and the row hashes
    assert torch.equal(model.tables.t.weight.detach(), table_values(2, 0, rows, (0, rows), (0, dim)))


@pytest.fixture
def one_rank(monkeypatch):
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _sharded(process_group) -> DistributedModelParallel:
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=50, feature_names=["f"])],
        device=torch.device("meta"),
    )
    plan = construct_module_sharding_plan(
        ebc, {"t": table_wise(rank=0, compute_kernel="fused")}, world_size=1, device_type="cpu"
    )
    return DistributedModelParallel(
        ebc,
        device=torch.device("cpu"),
        env=ShardingEnv.from_process_group(process_group),
        plan=ShardingPlan({"": plan}),
        sharders=build_sharders(),
    )


def test_torchrec_init_is_skipped_only_inside_the_context(one_rank):
    """Inside the context the fused kernel's weights stay as FBGEMM allocated them
    (zeros): neither the kernel nor the collection drew them; outside, torchrec draws."""
    with torchrec_table_init_skipped():
        skipped = _sharded(one_rank)
    drawn = _sharded(one_rank)
    weight = lambda dmp: dmp.state_dict()["embedding_bags.t.weight"].local_shards()[0].tensor
    assert torch.count_nonzero(weight(skipped)) == 0
    assert torch.count_nonzero(weight(drawn)) == 50 * 4
    assert init_embedding_tables(skipped, {"t": (50, 4)}, seed=0) == 1
    assert torch.equal(weight(skipped), table_values(0, 0, 50, (0, 50), (0, 4)))
