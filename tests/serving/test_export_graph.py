"""The exported fp32 program: one batched lookup for every table, so its graph does not
grow with the number of features (a 200-feature program with a lookup chain per
feature could not be loaded), and the same probabilities as the eager model, for
every interaction, with and without numerical features, one- and multi-hot."""

import io

import pytest
import torch

from models import ModelConfig, build_dlrm_train
from serving.export import export_program
from serving.inference_model import ConcatenatedTables, ProbabilityModel
from tests.support.model_state import interaction_sizes

DIM = 4
INTERACTIONS = ("original", "dcn", "projection")
# (numerical features, hotness of the features in turn): Criteo-like and a multi-hot spec without numerical ones.
LAYOUTS = {"dense_one_hot": (13, [1]), "categorical_multi_hot": (0, [1, 3, 2])}


def tiny_model(interaction: str, num_dense: int, num_features: int, seed: int = 0) -> torch.nn.Module:
    """Tables of 5 to 9 rows of width DIM; trained-looking (random) weights."""
    torch.manual_seed(seed)
    config = ModelConfig(
        [5 + f % 5 for f in range(num_features)],
        sparse_feature_names=[f"cat_{f}" for f in range(num_features)],
        dense_in_features=num_dense,
        embedding_dim=DIM,
        interaction_type=interaction,
        dense_arch_layer_sizes=[8, DIM],
        over_arch_layer_sizes=[8, 1],
        interaction=interaction_sizes(
            interaction,
            dcn_num_layers=2,
            dcn_low_rank_dim=4,
            interaction_branch1_layer_sizes=[8, 2 * DIM],
            interaction_branch2_layer_sizes=[8, 3 * DIM],
        ),
    )
    return build_dlrm_train(config, embedding_device=torch.device("cpu")).model.eval()


def hotness_of(pattern: list[int], num_features: int) -> list[int]:
    return [pattern[f % len(pattern)] for f in range(num_features)]


def inputs(dlrm: torch.nn.Module, num_dense: int, hotness: list[int], batch: int, seed: int = 1):
    """(dense, ids) with every id inside its feature's table."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.tensor([c.num_embeddings for c in dlrm.sparse_arch.embedding_bag_collection.embedding_bag_configs()])
    column_rows = rows.repeat_interleave(torch.tensor(hotness))
    ids = (torch.rand(batch, len(column_rows), generator=generator) * column_rows).long()
    return torch.randn(batch, num_dense, generator=generator), ids


def export(dlrm: torch.nn.Module, num_dense: int, hotness: list[int]) -> torch.export.ExportedProgram:
    names = dlrm.sparse_arch.sparse_feature_names
    with torch.no_grad():
        return export_program(
            ProbabilityModel(dlrm, names, hotness, concatenated_tables=True), inputs(dlrm, num_dense, hotness, 4)
        )


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_graph_size_does_not_grow_with_the_features(interaction, layout):
    num_dense, pattern = LAYOUTS[layout]
    programs = {f: export(tiny_model(interaction, num_dense, f), num_dense, hotness_of(pattern, f)) for f in (26, 100)}
    counts = {f: len(p.graph.nodes) for f, p in programs.items()}
    assert counts[26] == counts[100] < 80, counts
    lookups = [n for n in programs[100].graph.nodes if "embedding_bag" in str(n.target)]
    assert len(lookups) == 1


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_exported_program_equals_the_eager_model(interaction, layout):
    """Saved, loaded, and run on other batch sizes than the example's: the same bits as
    the eager model with TorchRec's own collection (each bag sums the same rows in the
    same order)."""
    num_dense, pattern = LAYOUTS[layout]
    dlrm = tiny_model(interaction, num_dense, 7)
    hotness = hotness_of(pattern, 7)
    buffer = io.BytesIO()
    torch.export.save(export(dlrm, num_dense, hotness), buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()
    eager = ProbabilityModel(dlrm, dlrm.sparse_arch.sparse_feature_names, hotness)
    for batch in (1, 33):
        dense, ids = inputs(dlrm, num_dense, hotness, batch, seed=batch)
        with torch.no_grad():
            assert torch.equal(loaded(dense, ids), eager(dense, ids))
    # The eager model is left with its own collection.
    assert not isinstance(dlrm.sparse_arch, ConcatenatedTables)


def test_an_id_outside_its_table_fails_as_in_the_collection():
    """Never a row of the neighbouring table: feature 0's table has 5 rows, so id 5
    (or -1) would read table 1 (or nothing) in the concatenation."""
    dlrm = tiny_model("original", 13, 3)
    names = dlrm.sparse_arch.sparse_feature_names
    loaded = export(dlrm, 13, [1, 1, 1]).module()
    eager = ProbabilityModel(dlrm, names)
    dense = torch.zeros(2, 13)
    for bad in (5, -1):
        ids = torch.tensor([[0, 0, 0], [bad, 0, 0]])
        with pytest.raises(RuntimeError) as eager_error:
            eager(dense, ids)
        with pytest.raises(RuntimeError) as exported_error:
            loaded(dense, ids)
        assert str(exported_error.value) == str(eager_error.value)
        assert "Expected i < index_size" in str(exported_error.value)


def test_lookup_refuses_columns_in_another_order():
    dlrm = tiny_model("original", 13, 3)
    with pytest.raises(ValueError, match="in its feature order"):
        ConcatenatedTables(dlrm.sparse_arch, ["cat_1", "cat_0", "cat_2"], [1, 1, 1])
