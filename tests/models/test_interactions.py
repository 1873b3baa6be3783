"""Model builders: parameter counts from first principles, output shapes, the registry
of interactions (every one built with and without numerical features; the logits a
seed gave before the registry), and the interaction flags."""

import math

import numpy as np
import pytest
import torch

from common.config_flags import FlagError
from data.batching import BatchBuilder
from data.binary.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES, SPARSE_FEATURE_NAMES
from models import ModelConfig, build_dlrm_train
from models.builder import move_dense_part
from models.interactions import INTERACTIONS, Interaction, register
from models.interactions.dcn import DCNConfig
from models.interactions.dot import DotConfig
from models.interactions.projection import ProjectionConfig
from tests.support.model_state import criteo_features, mlp_params
from training.flags import parse_config

ROWS = [10 + i for i in range(NUM_SPARSE_FEATURES)]


def expected_params(config: ModelConfig) -> int:
    F, D = len(config.num_embeddings_per_feature), config.embedding_dim
    tables = sum(config.num_embeddings_per_feature) * D
    bottom = mlp_params(config.dense_in_features, config.dense_arch_layer_sizes)
    if config.interaction_type == "original":
        interaction, over_in = 0, D + math.comb(F, 2) + F
    elif config.interaction_type == "dcn":
        width, rank = (F + 1) * D, config.interaction.dcn_low_rank_dim
        interaction = config.interaction.dcn_num_layers * (width * rank + rank * width + width)
        over_in = width
    else:
        b1, b2 = config.interaction.interaction_branch1_layer_sizes, config.interaction.interaction_branch2_layer_sizes
        interaction = mlp_params((F + 1) * D, b1) + mlp_params((F + 1) * D, b2)
        over_in = D + (b1[-1] // D) * (b2[-1] // D)
    return tables + bottom + interaction + mlp_params(over_in, config.over_arch_layer_sizes)


CONFIGS = {
    "original": ModelConfig(
        ROWS, **criteo_features(), embedding_dim=8, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[32, 1]
    ),
    "dcn": ModelConfig(
        ROWS,
        **criteo_features(),
        embedding_dim=8,
        interaction_type="dcn",
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[32, 1],
        interaction=DCNConfig(dcn_num_layers=2, dcn_low_rank_dim=4),
    ),
    "projection": ModelConfig(
        ROWS,
        **criteo_features(),
        embedding_dim=8,
        interaction_type="projection",
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[32, 1],
        interaction=ProjectionConfig(
            interaction_branch1_layer_sizes=[32, 24], interaction_branch2_layer_sizes=[32, 16]
        ),
    ),
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
    assert dense == mlp_params(NUM_DENSE_FEATURES, [512, 256, 64]) + mlp_params(
        64 + 325 + NUM_SPARSE_FEATURES, [512, 512, 256, 1]
    )


def test_tables_are_on_meta_device():
    model = build_dlrm_train(CONFIGS["original"])
    tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    assert len(tables) == NUM_SPARSE_FEATURES and all(t.is_meta for t in tables)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_move_dense_part_moves_everything_but_the_tables_in_place(name):
    """What a CUDA build does after drawing the MLPs on the CPU (CUDA's generator draws
    other numbers from the same seed): every dense parameter and buffer moves to the
    device with the values drawn; the tables stay where they are."""
    torch.manual_seed(0)
    dlrm = build_dlrm_train(CONFIGS[name], dense_device=torch.device("cpu"), embedding_device=torch.device("cpu")).model
    drawn = {n: p.detach().clone() for n, p in dlrm.named_parameters()}
    buffers = [n for n, _ in dlrm.named_buffers() if not n.startswith("sparse_arch.")]
    move_dense_part(dlrm, torch.device("meta"))
    assert [n for n, _ in dlrm.named_parameters()] == list(drawn)
    for n, p in dlrm.named_parameters():
        assert p.is_meta != n.startswith("sparse_arch."), n
        if not p.is_meta:
            assert torch.equal(p, drawn[n]), n
    assert all(b.is_meta for n, b in dlrm.named_buffers() if n in buffers)
    torch.manual_seed(0)
    again = build_dlrm_train(
        CONFIGS[name], dense_device=torch.device("cpu"), embedding_device=torch.device("cpu")
    ).model
    assert all(torch.equal(p, drawn[n]) for n, p in again.named_parameters()), "the draw depends on the seed alone"


def test_a_cuda_build_draws_the_same_mlps_as_a_cpu_build(monkeypatch):
    """The decision a CUDA build makes, checked without CUDA: the MLPs are drawn on the
    CPU from the seed (the values a CPU build gets) and handed to `move_dense_part` for
    the GPU; the tables stay on the meta device."""
    import models.builder

    moved = []
    monkeypatch.setattr(models.builder, "move_dense_part", lambda dlrm, device: moved.append((dlrm, device)))
    torch.manual_seed(0)
    cuda_build = build_dlrm_train(CONFIGS["dcn"], dense_device=torch.device("cuda", 0))
    torch.manual_seed(0)
    cpu_build = build_dlrm_train(CONFIGS["dcn"], dense_device=torch.device("cpu"))
    assert len(moved) == 1 and moved[0][0] is cuda_build.model and moved[0][1] == torch.device("cuda", 0)
    for (n, a), (_, b) in zip(cuda_build.named_parameters(), cpu_build.named_parameters()):
        assert a.is_meta == b.is_meta == ("embedding_bags" in n), n
        if not a.is_meta:
            assert torch.equal(a, b), n


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

    from models.arch import PooledSparseArch
    from models.interactions import dot

    DotInteraction = dot.blocks().DotInteraction

    torch.manual_seed(0)
    dense = torch.randn(6, 8, requires_grad=True)
    sparse = torch.randn(6, NUM_SPARSE_FEATURES, 8, requires_grad=True)
    ours, theirs = (
        DotInteraction(NUM_SPARSE_FEATURES)(dense, sparse),
        InteractionArch(NUM_SPARSE_FEATURES)(dense, sparse),
    )
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
        rng.random((4, NUM_DENSE_FEATURES), dtype=np.float32),
        (rng.random((4, NUM_SPARSE_FEATURES)) * np.asarray(ROWS)).astype(np.int32),
        np.zeros((4, 1), np.int32),
    ).sparse_features
    assert torch.equal(PooledSparseArch(ebc)(kjt), SparseArch(ebc)(kjt))


# Three features of 7, 8 and 9 rows, width 4, 4 rows; numerical features: 0 or 5.
REGISTRY_FEATURES = ["a", "b", "c"]
REGISTRY_SIZES = {
    "original": DotConfig(),
    "dcn": DCNConfig(dcn_num_layers=2, dcn_low_rank_dim=3),
    "projection": ProjectionConfig(interaction_branch1_layer_sizes=[8, 8], interaction_branch2_layer_sizes=[8, 12]),
}
# The logits of `_registry_logits` (seed 3) on main before the interactions registered
# themselves (commit 4884b54, two if/elif chains): the registry builds the same models.
LOGITS_BEFORE_THE_REGISTRY = {
    ("original", 0): [0.008345, 0.020505, 0.015648, 0.018824],
    ("original", 5): [-0.166389, -0.165159, -0.195257, -0.163796],
    ("dcn", 0): [-0.264168, -0.188231, -0.184561, -0.246476],
    ("dcn", 5): [-0.194966, -0.234614, -0.156142, -0.192375],
    ("projection", 0): [0.111075, 0.110815, 0.110446, 0.1114],
    ("projection", 5): [-0.183341, -0.182385, -0.192731, -0.170586],
}


def _registry_logits(interaction: str, num_dense: int, sizes=None) -> torch.Tensor:
    """The eval-mode logits (4,) of the model of ``interaction`` (``sizes``: its config,
    None: its defaults) built after seeding 3, on a fixed batch."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    torch.manual_seed(3)
    config = ModelConfig(
        [7, 8, 9],
        REGISTRY_FEATURES,
        num_dense,
        embedding_dim=4,
        interaction_type=interaction,
        dense_arch_layer_sizes=[6, 4],
        over_arch_layer_sizes=[16, 1],
        interaction=sizes,
    )
    model = build_dlrm_train(config, embedding_device=torch.device("cpu")).model.eval()
    generator = torch.Generator().manual_seed(1)
    lengths = torch.tensor([1, 2, 0, 1, 1, 3, 2, 1, 1, 1, 0, 2], dtype=torch.int32)
    ids = torch.randint(0, 7, (int(lengths.sum()),), generator=generator)
    dense = torch.randn(4, num_dense, generator=generator)
    with torch.no_grad():
        return model(dense, KeyedJaggedTensor(keys=REGISTRY_FEATURES, values=ids, lengths=lengths)).squeeze(-1)


@pytest.mark.parametrize("interaction, num_dense", list(LOGITS_BEFORE_THE_REGISTRY))
def test_registry_builds_the_models_of_before(interaction, num_dense):
    logits = _registry_logits(interaction, num_dense, REGISTRY_SIZES[interaction])
    torch.testing.assert_close(
        logits, torch.tensor(LOGITS_BEFORE_THE_REGISTRY[interaction, num_dense]), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("interaction, num_dense", [(name, dense) for name in INTERACTIONS for dense in (0, 5)])
def test_every_registered_interaction_builds_with_and_without_numerical_features(interaction, num_dense):
    """Over the registry (a new interaction is tested here with its defaults): one logit
    a row, finite, the same for the same seed, and a model without a bottom MLP when
    the data has no numerical features."""
    logits = _registry_logits(interaction, num_dense)
    assert logits.shape == (4,) and torch.isfinite(logits).all()
    assert torch.equal(logits, _registry_logits(interaction, num_dense))
    config = ModelConfig(
        [7, 8, 9],
        REGISTRY_FEATURES,
        num_dense,
        embedding_dim=4,
        interaction_type=interaction,
        dense_arch_layer_sizes=[6, 4],
        over_arch_layer_sizes=[16, 1],
    )
    assert isinstance(config.interaction, INTERACTIONS[interaction].config)
    assert hasattr(build_dlrm_train(config).model, "dense_arch") == (num_dense > 0)


def test_interaction_flags_reach_only_their_interaction():
    """Every interaction's flags parse on every command line (the public example's take
    them all); the chosen interaction's config holds its own, the others' are ignored
    (not checked: they build nothing)."""
    sizes = [
        "--dcn_num_layers",
        "0",
        "--interaction_branch1_layer_sizes",
        "64",
        "--interaction_branch2_layer_sizes",
        "96",
        "--embedding_dim",
        "32",
        "--dense_arch_layer_sizes",
        "64,32",
    ]
    assert parse_config(sizes, "dlrm_main.py", "").model.interaction == DotConfig()
    projection = parse_config(sizes + ["--interaction_type", "projection"], "dlrm_main.py", "").model
    assert projection.interaction == ProjectionConfig([64], [96])
    with pytest.raises(SystemExit) as refused:
        parse_config(sizes + ["--interaction_type", "dcn"], "dlrm_main.py", "")
    assert refused.value.code == 2


def test_interaction_config_must_be_the_type_s():
    with pytest.raises(TypeError, match="interaction_type 'dcn' takes a DCNConfig, got a ProjectionConfig"):
        ModelConfig([7], ["a"], 1, interaction_type="dcn", interaction=ProjectionConfig())
    with pytest.raises(FlagError, match="--interaction_type must be one of original, dcn, projection, got 'x'"):
        ModelConfig([7], ["a"], 1, interaction_type="x", dense_arch_layer_sizes=[64]).validate()


def test_register_refuses_a_name_or_a_flag_already_taken():
    with pytest.raises(ValueError, match="interaction 'dcn' is already registered"):
        register(Interaction("dcn", "DCNv2", DCNConfig, INTERACTIONS["dcn"].build))
    with pytest.raises(ValueError, match="flag --dcn_num_layers is already interaction 'dcn'"):
        register(Interaction("dcn_copy", "DCNv2", DCNConfig, INTERACTIONS["dcn"].build))
    assert list(INTERACTIONS) == ["original", "dcn", "projection"]
