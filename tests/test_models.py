"""Model builders: parameter counts from first principles and output shapes."""

import math

import numpy as np
import pytest
import torch

from data.batching import BatchBuilder
from data.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES, SPARSE_FEATURE_NAMES
from models import ModelConfig, build_dlrm_train
from tests.support.model_state import criteo_features, mlp_params

ROWS = [10 + i for i in range(NUM_SPARSE_FEATURES)]


def expected_params(config: ModelConfig) -> int:
    F, D = len(config.num_embeddings_per_feature), config.embedding_dim
    tables = sum(config.num_embeddings_per_feature) * D
    bottom = mlp_params(config.dense_in_features, config.dense_arch_layer_sizes)
    if config.interaction_type == "original":
        interaction, over_in = 0, D + math.comb(F, 2) + F
    elif config.interaction_type == "dcn":
        width, rank = (F + 1) * D, config.dcn_low_rank_dim
        interaction = config.dcn_num_layers * (width * rank + rank * width + width)
        over_in = width
    else:
        b1, b2 = config.interaction_branch1_layer_sizes, config.interaction_branch2_layer_sizes
        interaction = mlp_params((F + 1) * D, b1) + mlp_params((F + 1) * D, b2)
        over_in = D + (b1[-1] // D) * (b2[-1] // D)
    return tables + bottom + interaction + mlp_params(over_in, config.over_arch_layer_sizes)


CONFIGS = {
    "original": ModelConfig(ROWS, **criteo_features(), embedding_dim=8, dense_arch_layer_sizes=[16, 8],
                            over_arch_layer_sizes=[32, 1]),
    "dcn": ModelConfig(ROWS, **criteo_features(), embedding_dim=8, interaction_type="dcn",
                       dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[32, 1], dcn_num_layers=2,
                       dcn_low_rank_dim=4),
    "projection": ModelConfig(ROWS, **criteo_features(), embedding_dim=8, interaction_type="projection",
                              dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[32, 1],
                              interaction_branch1_layer_sizes=[32, 24],
                              interaction_branch2_layer_sizes=[32, 16]),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_count(name):
    config = CONFIGS[name]
    model = build_dlrm_train(config)  # tables on the meta device: numel still counts
    assert sum(p.numel() for p in model.parameters()) == expected_params(config)


def test_public_default_architecture_count():
    """The public example's default: dim 64, bottom 512-256-64, top 512-512-256-1."""
    config = ModelConfig([100_000] * NUM_SPARSE_FEATURES, **criteo_features())
    model = build_dlrm_train(config)
    dense = sum(p.numel() for n, p in model.named_parameters() if "embedding_bags" not in n)
    assert dense == mlp_params(NUM_DENSE_FEATURES, [512, 256, 64]) + mlp_params(64 + 325 + NUM_SPARSE_FEATURES, [512, 512, 256, 1])


def test_tables_are_on_meta_device():
    model = build_dlrm_train(CONFIGS["original"])
    tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    assert len(tables) == NUM_SPARSE_FEATURES and all(t.is_meta for t in tables)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_shapes(name):
    torch.manual_seed(0)
    model = build_dlrm_train(CONFIGS[name], embedding_device=torch.device("cpu"))
    rng = np.random.default_rng(0)
    batch = BatchBuilder(SPARSE_FEATURE_NAMES)(
        rng.random((5, NUM_DENSE_FEATURES), dtype=np.float32),
        (rng.random((5, NUM_SPARSE_FEATURES)) * np.asarray(ROWS)).astype(np.int32),
        rng.integers(0, 2, (5, 1), dtype=np.int32),
    )
    loss, (loss_again, logits, labels) = model(batch)
    assert loss.shape == () and torch.isfinite(loss) and loss_again == loss
    assert logits.shape == (5,) and labels.shape == (5,)


def test_fast_blocks_match_torchrec():
    """DotInteraction and PooledSparseArch give torchrec's outputs and gradients."""
    from torchrec.models.dlrm import InteractionArch, SparseArch

    from models.interaction import DotInteraction, PooledSparseArch

    torch.manual_seed(0)
    dense = torch.randn(6, 8, requires_grad=True)
    sparse = torch.randn(6, NUM_SPARSE_FEATURES, 8, requires_grad=True)
    ours, theirs = DotInteraction(NUM_SPARSE_FEATURES)(dense, sparse), InteractionArch(NUM_SPARSE_FEATURES)(dense, sparse)
    assert ours.shape == theirs.shape == (6, 8 + NUM_SPARSE_FEATURES + 325)
    assert torch.allclose(ours, theirs, atol=1e-6)
    weight = torch.randn_like(ours)
    grads_ours = torch.autograd.grad((ours * weight).sum(), (dense, sparse))
    grads_theirs = torch.autograd.grad((theirs * weight).sum(), (dense, sparse))
    for a, b in zip(grads_ours, grads_theirs):
        assert torch.allclose(a, b, atol=1e-5)

    model = build_dlrm_train(CONFIGS["original"], embedding_device=torch.device("cpu"))
    ebc = model.model.sparse_arch.embedding_bag_collection
    rng = np.random.default_rng(1)
    kjt = BatchBuilder(SPARSE_FEATURE_NAMES)(
        rng.random((4, NUM_DENSE_FEATURES), dtype=np.float32), (rng.random((4, NUM_SPARSE_FEATURES)) * np.asarray(ROWS)).astype(np.int32),
        np.zeros((4, 1), np.int32)).sparse_features
    assert torch.equal(PooledSparseArch(ebc)(kjt), SparseArch(ebc)(kjt))
