"""History features (--sequence_columns): DIN's and the transformer's pooling (and DIN's
gradients) against plain-torch references, padding that changes nothing, the table an
item shares with its history, every interaction and sequence interaction built over
them, and the flags' refusals."""

import unittest.mock

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

from common.config_flags import FlagError
from common.sequence_columns import parse_sequence_columns
from data.batching.loaders import build_loaders
from data.config import DataConfig
from models import ModelConfig, build_dlrm_train, sequence_arch
from models.interactions import INTERACTIONS
from models.sequence_arch import SequenceSparseArch, padded_history
from models.sequence_interactions import SEQUENCE_INTERACTIONS
from models.sequence_interactions.din import DINAttention
from models.sequence_interactions.transformer import SequenceTransformer
from tests.support.model_state import interaction_sizes

D, L = 4, 5


def din_reference(module: DINAttention, history: list[torch.Tensor], candidate: torch.Tensor) -> torch.Tensor:
    """DIN's pooling of one row, position by position, from the module's weights."""
    linears = [m for m in module.mlp if isinstance(m, torch.nn.Linear)]
    prelus = [m for m in module.mlp if isinstance(m, torch.nn.PReLU)]
    total = torch.zeros(D, dtype=torch.float64)
    for h in history:
        z = torch.cat((h, candidate, h - candidate, h * candidate)).double()
        for linear, prelu in zip(linears[:-1], prelus):
            z = linear.weight.double() @ z + linear.bias.double()
            z = torch.where(z > 0, z, prelu.weight.double() * z)
        score = linears[-1].weight.double() @ z + linears[-1].bias.double()
        total += score * h.double()
    return total


def _rows(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(history (B, L, D) with junk after each row's items, mask (B, L), candidate (B, D))."""
    generator = torch.Generator().manual_seed(seed)
    history = torch.randn(len(lengths), L, D, generator=generator)
    mask = torch.arange(L).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return history, mask, torch.randn(len(lengths), D, generator=generator)


@pytest.mark.parametrize("training", [True, False])
def test_din_matches_a_plain_torch_reference(training):
    torch.manual_seed(0)
    module = DINAttention(D, [6, 3], softmax=False).train(training)
    history, mask, candidate = _rows([3, 0, 5, 1])
    got = module(history, mask, candidate)
    for b, n in enumerate([3, 0, 5, 1]):
        expected = din_reference(module, list(history[b, :n]), candidate[b])
        assert torch.allclose(got[b].double(), expected, atol=1e-6), (b, got[b], expected)
    assert torch.equal(got[1], torch.zeros(D))  # no history: the zero vector


def test_din_gradients_match_the_plain_form():
    """The per-row first layer and PReLU's own backward give the gradients of the
    paper's form: the MLP over the concatenated [h, c, h - c, h * c]."""
    torch.manual_seed(0)
    module = DINAttention(D, [6, 3], softmax=False).double()
    history, mask, candidate = (t.double() if t.is_floating_point() else t for t in _rows([3, 0, 5, 1]))
    with torch.no_grad():  # slopes on both sides of 0, as after some training
        module.mlp[1].weight.fill_(-0.3)

    def plain(h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        target = c.unsqueeze(1).expand_as(h)
        scores = module.mlp(torch.cat((h, target, h - target, h * target), dim=-1)).squeeze(-1)
        return torch.bmm((scores * mask).unsqueeze(1), h).squeeze(1)

    grads = []
    for forward in (module, lambda h, c: plain(h, c)):
        module.zero_grad()
        h, c = history.clone().requires_grad_(), candidate.clone().requires_grad_()
        out = forward(h, mask, c) if forward is module else forward(h, c)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append([h.grad, c.grad, *(p.grad.clone() for p in module.parameters())])
    for got, expected in zip(*grads):
        assert torch.allclose(got, expected, rtol=1e-10, atol=1e-10)


def transformer_reference(module: SequenceTransformer, history: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """The transformer's pooling of one row's n items (n, D), in float64 over those n
    only: no padding, no mask."""
    n = history.shape[0]
    if n == 0:
        return torch.zeros(D, dtype=torch.float64)
    f = torch.nn.functional
    p = {name: value.detach().double() for name, value in module.named_parameters()}
    h = history.double()
    x = h + p["recency.weight"][torch.arange(n - 1, -1, -1)]
    for i, layer in enumerate(module.layers):
        heads, width = layer.num_heads, D // layer.num_heads
        q, k, v = f.linear(x, p[f"layers.{i}.qkv.weight"], p[f"layers.{i}.qkv.bias"]).split(D, dim=1)
        attended = torch.cat(
            [
                torch.softmax(q[:, s] @ k[:, s].T / width**0.5, dim=-1) @ v[:, s]
                for s in (slice(j * width, (j + 1) * width) for j in range(heads))
            ],
            dim=1,
        )
        x = x + f.linear(attended, p[f"layers.{i}.out.weight"], p[f"layers.{i}.out.bias"])
        x = f.layer_norm(x, (D,), p[f"layers.{i}.norm1.weight"], p[f"layers.{i}.norm1.bias"])
        hidden = f.relu(f.linear(x, p[f"layers.{i}.ffn.0.weight"], p[f"layers.{i}.ffn.0.bias"]))
        x = x + f.linear(hidden, p[f"layers.{i}.ffn.2.weight"], p[f"layers.{i}.ffn.2.bias"])
        x = f.layer_norm(x, (D,), p[f"layers.{i}.norm2.weight"], p[f"layers.{i}.norm2.bias"])
    query = f.linear(candidate.double(), p["query.weight"], p["query.bias"])
    scores = f.linear(x, p["key.weight"], p["key.bias"]) @ query / D**0.5
    return torch.softmax(scores, dim=0) @ (x + h)


@pytest.mark.parametrize("softmax", [False, True])
def test_din_trains_under_bf16_autocast_as_the_plain_form(softmax):
    """--amp on CPU: bf16 activations meet fp32 slopes in PReLU's own backward (a
    dtype clash there failed the GPU check's amp cases); its output and gradients keep
    the dtypes, and the values, of the plain layers under the same autocast."""
    torch.manual_seed(0)
    module = DINAttention(D, [6, 3], softmax=softmax).train()
    history, mask, candidate = _rows([3, 0, 5, 1])
    history.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = module(history, mask, candidate)
    got.float().sum().backward()
    slope = module.mlp[1].weight
    fast = (history.grad.clone(), slope.grad.clone())
    history.grad, slope.grad = None, None
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        unittest.mock.patch.object(sequence_arch, "prelu", torch.nn.functional.prelu),
    ):
        plain = module(history, mask, candidate)
    plain.float().sum().backward()
    assert got.dtype == plain.dtype and torch.equal(got, plain)
    assert fast[0].dtype == torch.float32 and fast[1].dtype == torch.float32
    assert torch.allclose(fast[0], history.grad, rtol=2e-2, atol=1e-2)
    assert torch.allclose(fast[1], slope.grad, rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("training", [True, False], ids=["fused_attention", "exported_form"])
def test_transformer_matches_a_plain_torch_reference(training):
    torch.manual_seed(0)
    module = SequenceTransformer(D, L, num_layers=2, num_heads=2, ffn_size=8).train(training)
    history, mask, candidate = _rows([3, 0, 5, 1])
    got = module(history, mask, candidate)
    for b, n in enumerate([3, 0, 5, 1]):
        expected = transformer_reference(module, history[b, :n], candidate[b])
        assert torch.allclose(got[b].double(), expected, atol=1e-5), (b, got[b], expected)


@pytest.mark.parametrize(
    "module",
    [
        lambda: DINAttention(D, [6], softmax=False),
        lambda: DINAttention(D, [6], softmax=True),
        lambda: SequenceTransformer(D, L, num_layers=2, num_heads=2, ffn_size=8),
    ],
    ids=["din", "din_softmax", "transformer"],
)
def test_padding_changes_nothing(module):
    torch.manual_seed(0)
    block = module()
    history, mask, candidate = _rows([2, 0, 5, 4])
    other_padding = torch.where(mask.unsqueeze(-1), history, torch.randn_like(history) * 100)
    got = block(history, mask, candidate)
    assert torch.isfinite(got).all()
    assert torch.equal(got, block(other_padding, mask, candidate))
    assert torch.equal(got[1], torch.zeros(D))
    # ... and the items do count.
    assert not torch.allclose(got[0], block(history.flip(1), mask, candidate)[0])


def test_din_softmax_weights_sum_to_one():
    torch.manual_seed(0)
    block = DINAttention(D, [6], softmax=True)
    history, mask, candidate = _rows([3])
    history[0, :3] = 1.0  # equal items: any weights that sum to 1 give the item
    assert torch.allclose(block(history, mask, candidate)[0], torch.ones(D), atol=1e-6)


def _config(**flags) -> ModelConfig:
    return ModelConfig(
        [7, 9, 11],
        ["a", "b", "c"],
        2,
        embedding_dim=D,
        dense_arch_layer_sizes=[6, D],
        over_arch_layer_sizes=[5, 1],
        sequence_columns=["h:a"],
        max_history=L,
        **flags,
    )


def test_sparse_arch_looks_up_the_history_in_the_items_table():
    """On a hand-made batch: the item's pooled vector is its table row (a bag of two:
    their sum), the history's is DIN over the same table's rows of its ids."""
    torch.manual_seed(0)
    model = build_dlrm_train(_config(), embedding_device=torch.device("cpu")).model
    arch = model.sparse_arch
    assert isinstance(arch, SequenceSparseArch)
    table = arch.embedding_collection.embeddings["t_a"].weight
    assert "t_a" not in arch.embedding_bag_collection.embedding_bags
    # rows: a = [2], [1, 3], [6]; h = [4, 0, 5], [], [6, 6, 6, 6, 6, 6] (longer than L: its first L)
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c", "h"],
        values=torch.tensor([2, 1, 3, 6, 0, 1, 2, 3, 4, 5, 4, 0, 5, 6, 6, 6, 6, 6, 6]),
        lengths=torch.tensor([1, 2, 1, 1, 1, 1, 1, 1, 1, 3, 0, 6]),
    )
    out = arch(kjt)
    assert out.shape == (3, 4, D)
    assert torch.equal(out[0, 0], table[2]) and torch.allclose(out[1, 0], table[1] + table[3])
    b_table = arch.embedding_bag_collection.embedding_bags["t_b"].weight
    assert torch.equal(out[2, 1], b_table[2])
    pooling = arch.sequence_pooling["h"]
    for row, ids in enumerate([[4, 0, 5], [], [6] * L]):
        expected = din_reference(pooling, [table[i] for i in ids], out[row, 0])
        assert torch.allclose(out[row, 3].double(), expected, atol=1e-5)
    # The candidate and the history train one table: the history's ids get gradients too.
    out[:, 3].sum().backward()
    assert table.grad[[0, 4, 5]].abs().sum() > 0


def test_padded_history_masks_after_each_rows_items():
    bag = JaggedTensor(values=torch.arange(12.0).view(6, 2), lengths=torch.tensor([2, 0, 4]))
    padded, mask = padded_history(bag, 3)
    assert mask.tolist() == [[True, True, False], [False] * 3, [True] * 3]
    assert padded[2].tolist() == [[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]] and padded[1].abs().sum() == 0


@pytest.mark.parametrize("sequence", sorted(SEQUENCE_INTERACTIONS))
@pytest.mark.parametrize("interaction", sorted(INTERACTIONS))
@pytest.mark.parametrize("dense", [2, 0], ids=["numerical", "categorical_only"])
def test_every_interaction_trains_over_histories(interaction, sequence, dense):
    """A forward and backward of every pair on random data's batch; the interaction
    reads F + 1 vectors (the history's)."""
    torch.manual_seed(0)
    sizes = {"interaction": interaction_sizes(interaction)} if interaction == "projection" else {}
    config = ModelConfig(
        [20] * 26,
        [f"cat_{i}" for i in range(26)],
        13 if dense else 0,
        embedding_dim=D,
        dense_arch_layer_sizes=[6, D],
        over_arch_layer_sizes=[5, 1],
        interaction_type=interaction,
        sequence_interaction=sequence,
        sequence_columns=["h3:cat_3"],
        max_history=L,
        **sizes,
    )
    model = build_dlrm_train(config, embedding_device=torch.device("cpu"))
    data = DataConfig.from_flags(sequence_columns=["h3:cat_3"], max_history=L, batch_size=8, limit_train_batches=1)
    batch = next(iter(build_loaders(data, None, [20] * 26, 0, 1)["train"]))
    if not dense:
        batch.dense_features = batch.dense_features[:, :0]
    assert batch.sparse_features.keys()[-1] == "h3" and batch.sparse_features["h3"].lengths().max() <= L
    loss, (_, logits, _) = model(batch)
    loss.backward()
    assert logits.shape == (8,) and torch.isfinite(loss)
    assert model.model.sparse_arch(batch.sparse_features).shape == (8, 27, D)


def test_random_histories_vary_in_length_down_to_empty():
    data = DataConfig.from_flags(sequence_columns=["h:cat_0"], max_history=4, batch_size=256, limit_train_batches=1)
    batch = next(iter(build_loaders(data, None, [50] * 26, 0, 1)["train"]))
    lengths = batch.sparse_features["h"].lengths().numpy()
    assert set(np.unique(lengths)) == {0, 1, 2, 3, 4}
    assert batch.sparse_features["h"].values().max() < 50


def test_flags_refuse_what_cannot_be_built(tmp_path):
    with pytest.raises(FlagError, match="HIST:ITEM"):
        parse_sequence_columns(["h"])
    with pytest.raises(FlagError, match="twice"):
        parse_sequence_columns(["h:a,h:b"])
    with pytest.raises(FlagError, match="'nope' is not a categorical feature"):
        DataConfig.from_flags(sequence_columns=["h:nope"]).validate().describe()
    with pytest.raises(FlagError, match="already a feature"):
        DataConfig.from_flags(sequence_columns=["cat_1:cat_0"]).validate().describe()
    with pytest.raises(FlagError, match="--max_history must be positive"):
        DataConfig.from_flags(sequence_columns=["h:cat_0"], max_history=0).validate()
    with pytest.raises(FlagError, match=r"--sequence_columns needs data with history features \(random or parquet"):
        DataConfig.from_flags(in_memory_binary_criteo_path=str(tmp_path), sequence_columns=["h:cat_1"]).validate()
    with pytest.raises(FlagError, match="--transformer_num_heads"):
        _config(
            sequence_interaction="transformer",
            sequence=SEQUENCE_INTERACTIONS["transformer"].config(transformer_num_heads=3),
        ).validate()


@pytest.mark.parametrize("sequence", ["din", "transformer"])
def test_learns_a_label_only_the_history_carries(sequence):
    """Label: whether the candidate item is in the row's history (empty ones included).
    Without the shared table no lookup of the history could match the candidate; with
    it DIN's [h, c, h - c, h * c] finds it, and so does the transformer's target
    attention (0.5 would be a guess; the transformer without its residual of the items'
    embeddings stayed near 0.6)."""
    from models.interactions.dcn import DCNConfig

    torch.manual_seed(0)
    items, batch_size = 50, 128
    config = ModelConfig(
        [items, 7],
        ["item", "other"],
        0,
        embedding_dim=8,
        over_arch_layer_sizes=[16, 1],
        interaction_type="dcn",
        interaction=DCNConfig(dcn_num_layers=1, dcn_low_rank_dim=8),
        sequence_interaction=sequence,
        sequence_columns=["hist:item"],
        max_history=6,
    )
    model = build_dlrm_train(config, embedding_device=torch.device("cpu"))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)

    def batch():
        item = torch.randint(0, items, (batch_size,), generator=generator)
        lengths = torch.randint(0, 7, (batch_size,), generator=generator)
        history = torch.randint(0, items, (int(lengths.sum()),), generator=generator)
        rows = torch.repeat_interleave(torch.arange(batch_size), lengths)
        # Half the rows get their candidate at a random place of their (non-empty) history.
        starts = torch.cumsum(lengths, 0) - lengths
        planted = (torch.rand(batch_size, generator=generator) < 0.5) & (lengths > 0)
        where = starts + (torch.rand(batch_size, generator=generator) * lengths).long().clamp(max=5)
        history[where[planted]] = item[planted]
        labels = torch.zeros(batch_size, dtype=torch.int32).index_add_(0, rows, (history == item[rows]).int()) > 0
        kjt = KeyedJaggedTensor(
            keys=["item", "other", "hist"],
            values=torch.cat([item, torch.randint(0, 7, (batch_size,), generator=generator), history]),
            lengths=torch.cat([torch.ones(2 * batch_size, dtype=torch.int64), lengths]),
        )
        return Batch(dense_features=torch.zeros(batch_size, 0), sparse_features=kjt, labels=labels.int())

    for _ in range(300):
        loss, _ = model(batch())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        _, (_, logits, labels) = model(batch())
    assert binary_auroc(logits, labels).item() > 0.85  # here: DIN 1.0, the transformer 0.94


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prelus_own_backward_equals_torchs(dtype):
    """PReLU's forward and leaky-ReLU-based backward against torch's operator: the same
    output and input gradient, the slope's gradient to summation order, zeros included."""
    torch.manual_seed(0)
    x = torch.randn(4, 7, 5).to(dtype)
    x[0, 0] = 0
    grad = torch.randn(4, 7, 5).to(dtype)
    results = []
    for function in (sequence_arch.prelu, torch.nn.functional.prelu):
        inp, weight = x.clone().requires_grad_(), torch.tensor([-0.3]).requires_grad_()
        out = function(inp, weight if function is sequence_arch.prelu else weight.to(dtype))
        out.backward(grad)
        results.append((out, inp.grad, weight.grad))
    (out, grad_x, grad_w), (expected, expected_x, expected_w) = results
    assert out.dtype == dtype and torch.equal(out, expected)
    assert grad_x.dtype == dtype and torch.equal(grad_x, expected_x)
    assert grad_w.dtype == torch.float32
    torch.testing.assert_close(grad_w, expected_w.float(), rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)
