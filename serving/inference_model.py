"""A trained model as a single-host predictor: (dense, sparse ids) -> click probability.

`ProbabilityModel` takes plain tensors, so that exported programs need no TorchRec
types at their boundary: dense features (B, num_dense) float32, already transformed,
and categorical ids (B, sum of hotness) int64, already mapped into the table ranges:
one column per feature for Criteo (raw lines have one value per feature), a fixed
number per multi-hot feature of a feature-spec data set. A model of Parquet data
(bags of any length, empty ones too) is exported ``padded``: each feature's columns
hold its bag's ids, then `PADDING_ID` for the places the bag leaves empty.
`load_checkpoint_model` rebuilds the unsharded model from a (sharded) checkpoint in
one process.

The exported fp32 program looks every table up at once (`ConcatenatedTables`: one
weight, one ``embedding_bag``): TorchRec's collection runs a chain of operators per
feature, which made a 200-feature program too large for ``torch.export.load``.

Example::

    model, meta = load_checkpoint_model("ckpt/step_000000100")
    probabilities = ProbabilityModel(model.model, meta.model.sparse_feature_names)(dense, sparse)
"""

import copy
import itertools
from typing import Any

import torch
from torch import nn
from torchrec.models.dlrm import DLRMTrain
from torchrec.modules.embedding_configs import PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from checkpoints.load import check_stored_shapes, load_checkpoint
from checkpoints.meta import CheckpointMeta
from checkpoints.opened import OpenedCheckpoint, open_checkpoint
from common.calibration import Calibration
from models import build_dlrm_train
from models.arch import PooledSparseArch
from models.sequence_arch import SequenceSparseArch
from serving.model_inputs import PADDING_ID


@torch.fx.wrap
def fixed_hot_features(keys: list[str], hotness: list[int], sparse: torch.Tensor, padded: bool) -> KeyedJaggedTensor:
    """Rows of ids (B, sum(hotness)), feature f taking hotness[f] consecutive columns,
    as a KJT (feature-major values; every bag of feature f has hotness[f] ids, or,
    ``padded``, the ids of its columns that are not `PADDING_ID`).

    A leaf for fx tracing, so that TorchScript compiles it as is (the quantized variants of
    earlier exports; tests/serving/test_export_quantized.py compares the programs with them).
    """
    batch = sparse.shape[0]
    num_features = len(hotness)
    device = sparse.device
    if padded:
        values_parts: list[torch.Tensor] = []
        length_parts: list[torch.Tensor] = []
        start = 0
        for size in hotness:
            block = sparse[:, start : start + size]
            present = block >= 0  # PADDING_ID is the one negative id (TorchScript reads no global)
            values_parts.append(block[present])  # row by row, each bag's ids in column order
            length_parts.append(present.sum(1).to(torch.int32))
            start += size
        lengths = torch.cat(length_parts)
        offsets = torch.cat(
            [torch.zeros(1, dtype=torch.int32, device=device), torch.cumsum(lengths, 0, dtype=torch.int32)]
        )
        return KeyedJaggedTensor(keys=keys, values=torch.cat(values_parts), lengths=lengths, offsets=offsets)
    if hotness == [hotness[0]] * num_features:
        # Every bag the same size (Criteo: one id each): a transpose and ranges, no
        # per-feature ops; this runs on every serving request.
        size = hotness[0]
        values = sparse.reshape(batch, num_features, size).transpose(0, 1).reshape(-1)
        lengths = torch.full([num_features * batch], size, dtype=torch.int32, device=device)
        offsets = torch.arange(num_features * batch + 1, dtype=torch.int32, device=device) * size
        return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, offsets=offsets)
    parts: list[torch.Tensor] = []
    start = 0
    for size in hotness:
        parts.append(sparse[:, start : start + size].reshape(-1))
        start += size
    lengths = torch.repeat_interleave(torch.tensor(hotness, dtype=torch.int32, device=device), batch)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int32, device=device), torch.cumsum(lengths, 0, dtype=torch.int32)])
    return KeyedJaggedTensor(keys=keys, values=torch.cat(parts), lengths=lengths, offsets=offsets)


def feature_tables(sparse_arch: PooledSparseArch) -> tuple[list[int], list[torch.Tensor]]:
    """Each categorical feature's table, in the arch's feature order: its rows and its
    weight (detached). A `SequenceSparseArch` holds the tables of its history items in
    its EmbeddingCollection, the others in its EmbeddingBagCollection; a plain arch
    holds them all in its EmbeddingBagCollection. Refuses tables that are not sum-pooled
    (ValueError)."""
    configs = sparse_arch.embedding_bag_collection.embedding_bag_configs()
    if any(c.pooling != PoolingType.SUM for c in configs):
        raise ValueError("ConcatenatedTables takes an unsharded collection of sum-pooled tables")
    bags = sparse_arch.embedding_bag_collection.embedding_bags
    by_feature = {name: (c.num_embeddings, bags[c.name].weight) for c in configs for name in c.feature_names}
    if isinstance(sparse_arch, SequenceSparseArch):
        # An item's table serves its histories too: the item (its first feature) names it here.
        for c in sparse_arch.embedding_collection.embedding_configs():
            by_feature[c.feature_names[0]] = (
                c.num_embeddings,
                sparse_arch.embedding_collection.embeddings[c.name].weight,
            )
    tables = [by_feature[name] for name in sparse_arch.sparse_feature_names]
    return [rows for rows, _ in tables], [weight.detach() for _, weight in tables]


class ConcatenatedTables(nn.Module):
    """The pooled lookups of an unsharded `PooledSparseArch`, all tables at once:
    rows of ids (B, sum(hotness)) -> (B, F, D), through one weight holding every table
    one after the other and one ``embedding_bag``. Its graph is the same for any number
    of features; each bag sums the same rows in the same order as the collection.

    An id outside its feature's table is sent past the last row, so the lookup fails
    as the collection's own would, never reading a neighbouring table. ``padded``: a
    `PADDING_ID` column adds nothing to its bag (it looks up a zero row after the
    tables, ``embedding_bag``'s ``padding_idx``), so a bag of padding alone is empty.

    Args:
        sparse_arch: the tables (copied: the weight is their concatenation).
        sparse_feature_names: the features in the column order of the ids: the sparse
            arch's own order (the export's inputs follow the model's feature order).
        hotness: ids per row of each feature, in that order.
        padded: whether ids may hold `PADDING_ID` (a model of Parquet data).

    Example::

        lookup = ConcatenatedTables(dlrm.sparse_arch, ["cat_0", "cat_1"], [1, 3])
        lookup(torch.tensor([[4, 0, 1, 2]])).shape  # (1, 2, D)
    """

    def __init__(
        self, sparse_arch: PooledSparseArch, sparse_feature_names: list[str], hotness: list[int], padded: bool = False
    ) -> None:
        super().__init__()
        if sparse_arch.output_order is not None or sparse_feature_names != sparse_arch.sparse_feature_names:
            raise ValueError(
                "ConcatenatedTables takes an unsharded collection of sum-pooled tables, "
                "with the ids' columns in its feature order"
            )
        rows, weights = feature_tables(sparse_arch)
        first_row = list(itertools.accumulate(rows[:-1], initial=0))  # of each table in the concatenation
        if padded:  # the padding row, after every table
            weights.append(torch.zeros(1, sparse_arch.D, dtype=weights[0].dtype))
        self.weight = nn.Parameter(torch.cat(weights), requires_grad=False)
        # Per id column: its table's size and first row. Per feature: its first column.
        self.register_buffer(
            "column_rows", torch.tensor(rows).repeat_interleave(torch.tensor(hotness)), persistent=False
        )
        self.register_buffer(
            "column_first_row", torch.tensor(first_row).repeat_interleave(torch.tensor(hotness)), persistent=False
        )
        self.register_buffer(
            "feature_first_column", torch.tensor(list(itertools.accumulate(hotness[:-1], initial=0))), persistent=False
        )
        self.total_rows = sum(rows)
        self.padding_row: int | None = self.total_rows if padded else None
        self.outside_row = self.total_rows + int(padded)  # past the last row of the weight
        self.num_columns = sum(hotness)
        self.F = len(rows)
        self.D = sparse_arch.D
        self.first_row = first_row  # of each feature's table, for the histories looked up in them
        self.rows = rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        batch = ids.shape[0]
        in_table = (ids >= 0) & (ids < self.column_rows)
        rows = torch.where(in_table, ids + self.column_first_row, self.outside_row)
        if self.padding_row is not None:
            rows = torch.where(ids == PADDING_ID, self.padding_row, rows)
        bag_starts = (torch.arange(batch, device=ids.device) * self.num_columns).unsqueeze(
            1
        ) + self.feature_first_column
        pooled = nn.functional.embedding_bag(
            rows.reshape(-1), self.weight, bag_starts.reshape(-1), mode="sum", padding_idx=self.padding_row
        )
        return pooled.view(batch, self.F, self.D)

    # The two halves of `PooledSparseArch`'s lookup, which `OverlappedDLRM` calls apart.
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self(ids)

    def arrange(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled


class SequenceTables(nn.Module):
    """The lookups of an unsharded `SequenceSparseArch` in plain tensors: (ids (B, sum
    of hotness), history values (N,) int64, history lengths (B, S) int64) -> (B, F + S,
    D), as the arch gives them.

    The candidates are looked up by `ConcatenatedTables`. Each history's ids are looked
    up in its item's table, in the same weight. The histories are jagged: ``lengths[b,
    s]`` ids of row b's history s, the values row by row and, within a row, history by
    history (row 0's history 0, row 0's history 1, row 1's history 0, ...), each
    history oldest first. A history longer than ``max_history`` keeps its newest
    ``max_history`` items, as training's data does (the arch itself keeps the first:
    its data holds no longer ones). Every size is the batch's or ``max_history``, none
    data-dependent, so torch.export and AOTInductor take any batch and any total length.

    Args:
        sparse_arch: the model's (its tables are copied; its sequence poolings are shared).
        sparse_feature_names, hotness, padded: as `ConcatenatedTables`.
    """

    def __init__(
        self, sparse_arch: SequenceSparseArch, sparse_feature_names: list[str], hotness: list[int], padded: bool = False
    ) -> None:
        super().__init__()
        self.candidates = ConcatenatedTables(sparse_arch, sparse_feature_names, hotness, padded)
        self.sequence_pooling = sparse_arch.sequence_pooling
        sequences = sparse_arch.sequences
        self.history_names = [history for history, _ in sequences]
        items = [sparse_feature_names.index(item) for _, item in sequences]
        self.register_buffer("history_rows", torch.tensor([self.candidates.rows[f] for f in items]), persistent=False)
        self.register_buffer(
            "history_first_row", torch.tensor([self.candidates.first_row[f] for f in items]), persistent=False
        )
        self.item_index = items
        self.max_history = sparse_arch.max_history
        self.S = len(sequences)
        self.D = self.candidates.D

    def forward(self, features: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, values, lengths = features
        candidates = self.candidates(ids)  # (B, F, D)
        batch = ids.shape[0]
        length = self.max_history
        counts = lengths.reshape(-1)  # (B * S): row by row, history by history
        kept = counts.clamp(max=length)
        first = torch.cumsum(counts, 0) - kept  # of the newest `kept` items of each history
        position = torch.arange(length, device=ids.device)
        valid = position < kept.unsqueeze(1)  # (B * S, L)
        total = values.shape[0]
        # One place past the values, for the positions a history leaves empty (and an empty batch).
        index = torch.where(valid, first.unsqueeze(1) + position, total)
        items = torch.cat((values, torch.zeros(1, dtype=values.dtype, device=values.device)))[index]
        table_rows = self.history_rows.repeat(batch).unsqueeze(1)
        first_row = self.history_first_row.repeat(batch).unsqueeze(1)
        in_table = (items >= 0) & (items < table_rows)
        # An id outside its item's table fails the lookup, as `ConcatenatedTables`'s; an empty place reads row 0, zeroed.
        rows = torch.where(valid, torch.where(in_table, items + first_row, self.candidates.outside_row), 0)
        histories = nn.functional.embedding(rows, self.candidates.weight) * valid.unsqueeze(-1).to(
            self.candidates.weight.dtype
        )
        histories = histories.view(batch, self.S, length, self.D)
        mask = valid.view(batch, self.S, length)
        pooled = [
            self.sequence_pooling[name](histories[:, s], mask[:, s], candidates[:, self.item_index[s]])
            for s, name in enumerate(self.history_names)
        ]
        return torch.cat((candidates, torch.stack(pooled, dim=1)), dim=1)

    # The two halves of the arch's lookup, which `OverlappedDLRM` calls apart.
    def lookup(self, features: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self(features)

    def arrange(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled


class CalibratedProbability(nn.Module):
    """Logits (B,) -> the calibrated probabilities of a `Calibration` (common/calibration.py):
    Platt's sigmoid(slope * logit + intercept), or isotonic's step function (the value
    of the last block whose threshold is below the logit). Its operators (mul, add,
    sigmoid; lt, sum, index) are among those serving/exported_operators.json allows."""

    def __init__(self, calibration: Calibration) -> None:
        super().__init__()
        self.platt = calibration.method == "platt"
        self.register_buffer("slope", torch.tensor(calibration.slope, dtype=torch.float32))
        self.register_buffer("intercept", torch.tensor(calibration.intercept, dtype=torch.float32))
        self.register_buffer("thresholds", torch.tensor(calibration.thresholds, dtype=torch.float32))
        self.register_buffer("values", torch.tensor(calibration.values, dtype=torch.float32))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        if self.platt:
            return torch.sigmoid(logits * self.slope + self.intercept)
        below = torch.lt(self.thresholds, logits.unsqueeze(-1)).to(torch.int64).sum(dim=-1)
        return self.values[below]


class ProbabilityModel(nn.Module):
    """Wraps a DLRM (any interaction) to map (dense, sparse ids) to probabilities (B,).

    Args:
        dlrm: the model without its loss (``DLRMTrain.model``), plain or quantized.
        sparse_feature_names: the KJT keys, in the column order of ``sparse``.
        hotness: ids per row of each feature (default one each): feature f takes
            hotness[f] consecutive columns of ``sparse``.
        concatenated_tables: look the (unsharded, unquantized) tables up through
            `ConcatenatedTables`, a copy of them; ``dlrm`` is left as it is. Default:
            through the model's own collection and a KJT (quantized models: FBGEMM's
            kernel batches their tables itself).
        padded: ``sparse`` may hold `PADDING_ID` after a bag's ids (bags shorter than
            their hotness: a model of Parquet data).
        calibration: applied to the logits instead of the plain sigmoid (``--calibrate``);
            None: the model's own probabilities.
    """

    def __init__(
        self,
        dlrm: nn.Module,
        sparse_feature_names: list[str],
        hotness: list[int] | None = None,
        concatenated_tables: bool = False,
        padded: bool = False,
        calibration: Calibration | None = None,
    ) -> None:
        super().__init__()
        self.calibration = calibration
        self.calibrate = CalibratedProbability(calibration) if calibration is not None else None
        self.sparse_feature_names = list(sparse_feature_names)
        self.hotness = list(hotness) if hotness is not None else [1] * len(self.sparse_feature_names)
        self.concatenated_tables = concatenated_tables
        self.padded = padded
        self.histories = isinstance(dlrm.sparse_arch, SequenceSparseArch)
        if self.histories and not concatenated_tables:
            raise ValueError("a model with history features is looked up through its concatenated tables only")
        if concatenated_tables:
            # A shallow copy with its own module table: the same dense layers, another sparse arch.
            tables = SequenceTables if self.histories else ConcatenatedTables
            lookup = tables(dlrm.sparse_arch, self.sparse_feature_names, self.hotness, padded)
            dlrm = copy.copy(dlrm)
            dlrm._modules = dict(dlrm._modules)
            dlrm.sparse_arch = lookup
        self.dlrm = dlrm

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        # The DLRMs hand their sparse input to the sparse arch untouched: ids for ConcatenatedTables.
        features = (
            sparse
            if self.concatenated_tables
            else fixed_hot_features(self.sparse_feature_names, self.hotness, sparse, self.padded)
        )
        return self.probabilities(self.dlrm(dense, features).squeeze(-1))

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        if self.calibrate is not None:
            return self.calibrate(logits)
        return torch.sigmoid(logits)


class SequenceProbabilityModel(ProbabilityModel):
    """`ProbabilityModel` of a model with history features (``--sequence_columns``):
    (dense, sparse ids, history values (N,) int64, history lengths (B, S) int64) ->
    probabilities (B,), the histories jagged as `SequenceTables` takes them (S: the
    model's histories, in ``--sequence_columns`` order). Always through concatenated
    tables (arguments as `ProbabilityModel`'s)."""

    def forward(  # type: ignore[override]
        self, dense: torch.Tensor, sparse: torch.Tensor, history_values: torch.Tensor, history_lengths: torch.Tensor
    ) -> torch.Tensor:
        return self.probabilities(self.dlrm(dense, (sparse, history_values, history_lengths)).squeeze(-1))


def load_checkpoint_model(
    checkpoint: str | OpenedCheckpoint, extra_state: dict[str, Any] | None = None
) -> tuple[DLRMTrain, CheckpointMeta]:
    """The unsharded fp32 model of a checkpoint (a path, or one opened already: any
    world size and plan), in eval mode, and the checkpoint's meta.json. Needs no
    process group.

    ``extra_state``: other sections of the checkpoint, filled in place by the same load
    (the export's seen-id filters).

    Raises CheckpointError when the checkpoint is missing, incomplete or unreadable.
    """
    opened = checkpoint if isinstance(checkpoint, OpenedCheckpoint) else open_checkpoint(checkpoint)
    meta = opened.meta
    model_config = meta.model
    # fp32 tables whatever the training precision: DCP casts fp16 weights on load, and
    # quantization starts from fp32.
    model_config.embedding_precision = "fp32"
    # The tables meta.json declares, checked against what is stored before any is allocated.
    on_meta = build_dlrm_train(model_config, dense_device=torch.device("meta"), embedding_device=torch.device("meta"))
    check_stored_shapes(opened, {"model": on_meta.state_dict()})
    model = build_dlrm_train(model_config, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"))
    state = {"model": model.state_dict(), **(extra_state or {})}
    load_checkpoint(opened, state, rank=0, restore_rng=False)
    model.load_state_dict(state["model"])
    return model.eval(), meta
