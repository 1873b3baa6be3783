"""The tiny model the sequence-training tests train (random and Parquet histories alike),
and their checks of its runs (what `launch` returns per rank: losses, tables, dense)."""

import math
from typing import Any

import torch

from harness.matrix import assemble_table


def tiny_sequence_model(rows: int, steps: int) -> list[str]:
    """Flags of a small DIN model with ``rows``-row tables, trained ``steps`` steps by
    SGD, no validation or test: a launch of a few seconds."""
    return [
        "--num_embeddings",
        str(rows),
        "--embedding_dim",
        "8",
        "--dense_arch_layer_sizes",
        "16,8",
        "--over_arch_layer_sizes",
        "16,1",
        "--din_attention_layer_sizes",
        "8",
        "--optimizer",
        "sgd",
        "--learning_rate",
        "0.5",
        "--seed",
        "5",
        "--limit_train_batches",
        str(steps),
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "0",
        "--log_every_n_steps",
        "100",
        "--device",
        "cpu",
    ]


def assert_ranks_match_reference(
    reference: dict[str, Any], per_rank: list[dict[str, Any]], rows: int, tolerance: float
) -> None:
    """The sharded run's losses, assembled tables and dense weights are the one-process
    reference's within ``tolerance`` (tables of ``rows`` rows, dim 8)."""
    assert len(reference["losses"]) == len(per_rank[0]["losses"])
    for a, b in zip(reference["losses"], per_rank[0]["losses"]):
        assert math.isclose(a, b, rel_tol=0, abs_tol=tolerance), (reference["losses"], per_rank[0]["losses"])
    for table in reference["tables"]:
        expected = assemble_table([reference], table, rows, 8)
        got = assemble_table(per_rank, table, rows, 8)
        assert torch.allclose(got, expected, rtol=0, atol=tolerance), (table, (got - expected).abs().max())
    assert reference["dense"].keys() == per_rank[0]["dense"].keys()
    for key, expected in reference["dense"].items():
        for result in per_rank:
            assert torch.allclose(result["dense"][key], expected, rtol=0, atol=tolerance), key


def assert_resumed_matches_uninterrupted(per_rank: list[dict[str, Any]], stop: int) -> None:
    """Each rank's run resumed at step ``stop`` ends bit for bit where it did uninterrupted."""
    for result in per_rank:
        resumed = result["resumed"]
        assert resumed["losses"] == result["losses"][stop:]
        for table, pieces in result["tables"].items():
            for (r, c, piece), (r2, c2, again) in zip(pieces, resumed["tables"][table]):
                assert (r, c) == (r2, c2) and torch.equal(piece, again), table
        for key, value in result["dense"].items():
            assert torch.equal(value, resumed["dense"][key]), key
