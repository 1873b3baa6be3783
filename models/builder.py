"""Builds DLRM-family models from a `ModelConfig`, with embedding tables on the meta device.

Tables stay on the meta device so that no rank ever allocates a full table: the
sharder materialises only each rank's shards.
"""

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.models.dlrm import DLRMTrain
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from models.arch import PooledSparseArch
from models.config import ModelConfig
from models.interactions import INTERACTIONS
from models.sequence_arch import build_sequence_sparse_arch
from models.sequence_interactions import SEQUENCE_INTERACTIONS


def build_embedding_bag_configs(config: ModelConfig) -> list[EmbeddingBagConfig]:
    """One table per categorical feature, named ``t_<feature>``, in the configured precision."""
    data_type = DataType.FP16 if config.embedding_precision == "fp16" else DataType.FP32
    return [
        EmbeddingBagConfig(
            name=table,
            embedding_dim=config.embedding_dim,
            num_embeddings=rows,
            feature_names=[feature],
            data_type=data_type,
        )
        for table, feature, rows in zip(
            config.table_names, config.sparse_feature_names, config.num_embeddings_per_feature
        )
    ]


class ActivationThenDropout(nn.Module):
    """A layer's activation followed by dropout (identity in eval mode).

    Args:
        activation: the layer's activation (torch.relu in torchrec's MLPs).
        p: probability of zeroing an element in training.
    """

    def __init__(self, activation: Callable[[torch.Tensor], torch.Tensor], p: float) -> None:
        super().__init__()
        self.activation = activation
        self.dropout = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.activation(x))


def add_over_arch_dropout(dlrm: nn.Module, p: float) -> None:
    """Dropout after every hidden layer of the over arch (never on the logit). The
    parameters and their names do not change, so checkpoints load either way."""
    hidden_layers = dlrm.over_arch.model[0]._mlp  # OverArch: Sequential(MLP(hidden sizes), Linear(-> 1))
    for perceptron in hidden_layers:
        perceptron._activation_fn = ActivationThenDropout(perceptron._activation_fn, p)


class WeightedDLRMTrain(DLRMTrain):
    """DLRMTrain whose loss weighs each row: sum(w * bce) / ``batch.weight_normalizer``.

    It reads `data.batching.WeightedBatch` objects. The normalizer is the global
    batch's weight sum over the number of ranks, so the ranks' losses average to
    sum(w * bce) / sum(w) over the global batch: a weighted mean, whose scale (and so
    the effective learning rate) does not change when every weight is scaled, which
    is 1 everywhere the plain mean, and which makes W ranks take the step one rank
    takes on the same global batch. Same parameters and names as DLRMTrain
    (checkpoints load either way); its outputs add the weights for the metrics:
    ``(loss, (loss, logits, labels, weights))``.
    """

    def forward(self, batch) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:  # type: ignore[override]
        logits = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        losses = F.binary_cross_entropy_with_logits(logits, batch.labels.float(), reduction="none")
        loss = (batch.weights * losses).sum() / batch.weight_normalizer
        return loss, (loss.detach(), logits.detach(), batch.labels.detach(), batch.weights.detach())


def move_dense_part(dlrm: nn.Module, device: torch.device) -> None:
    """Moves every parameter and buffer of ``dlrm`` but its tables (``sparse_arch``,
    which may be on the meta device) to ``device``, in place."""
    for name, child in dlrm.named_children():
        if name == "sparse_arch":  # its tables stay; its sequence interactions (if any) move
            child = getattr(child, "sequence_pooling", None)
            if child is None:
                continue
        for module in child.modules():
            for param_name, param in list(module.named_parameters(recurse=False)):
                setattr(module, param_name, nn.Parameter(param.detach().to(device), param.requires_grad))
            for buffer_name, buffer in list(module.named_buffers(recurse=False)):
                setattr(module, buffer_name, buffer.to(device))


def build_dlrm_train(
    config: ModelConfig,
    dense_device: torch.device | None = None,
    embedding_device: torch.device = torch.device("meta"),
    dropout: float = 0.0,
    weighted: bool = False,
) -> DLRMTrain:
    """Builds the model wrapped with its BCE-with-logits loss.

    Args:
        config: the architecture; validated here.
        dense_device: where the MLPs are (None: the default device); drawn on the CPU
            for any other device, so that a seed gives the same weights everywhere.
        embedding_device: where the tables are created; "meta" (the default) for
            sharding, a real device for an unsharded model.
        dropout: dropout probability after the over arch's hidden layers in training
            (0: none, the model is unchanged).
        weighted: a `WeightedDLRMTrain`, for batches with sample weights.

    Returns:
        a `DLRMTrain` whose forward takes a torchrec `Batch` and returns
        ``(loss, (loss, logits, labels))``; its model is what the interaction's
        registered build function makes (models/interactions/).

    Example::

        model = build_dlrm_train(ModelConfig(num_embeddings_per_feature=[100, 200],
                                             sparse_feature_names=["user", "item"], dense_in_features=13))
    """
    config.validate()
    # The MLPs are drawn by the CPU's generator and then moved to ``dense_device``: CUDA's
    # generator draws other numbers from the same seed, and one seed should give one model
    # on every device, as the tables' seeded init does.
    draws_elsewhere = dense_device is not None and dense_device.type not in ("cpu", "meta")
    draw_device = torch.device("cpu") if draws_elsewhere else dense_device
    bag_configs = build_embedding_bag_configs(config)
    if config.sequence_columns:
        sparse_arch: PooledSparseArch = build_sequence_sparse_arch(
            bag_configs,
            config.sequences,
            config.max_history,
            {
                history: SEQUENCE_INTERACTIONS[config.sequence_interaction].build(
                    config, config.sequence, config.max_history, draw_device
                )
                for history, _ in config.sequences
            },
            embedding_device,
        )
        # The interaction reads the histories' pooled vectors as more features.
        interaction_sizes = dataclasses.replace(
            config,
            sparse_feature_names=config.interaction_feature_names,
            num_embeddings_per_feature=[*config.num_embeddings_per_feature, *[1] * len(config.sequences)],
            sequence_columns=[],
        )
    elif config.zch_eviction_policy is not None:  # --id_hashing zch: the remapping ahead of the tables
        from models.zch import ZchOptions, ZchPooledEmbeddings, build_zch_collection

        options = ZchOptions(config.zch_eviction_policy, config.zch_eviction_interval)
        zch = ZchPooledEmbeddings(build_zch_collection(bag_configs, options, embedding_device))
        sparse_arch = PooledSparseArch(zch)  # type: ignore[arg-type]
        interaction_sizes = config
    else:
        sparse_arch = PooledSparseArch(EmbeddingBagCollection(tables=bag_configs, device=embedding_device))
        interaction_sizes = config
    dlrm = INTERACTIONS[config.interaction_type].build(interaction_sizes, sparse_arch, draw_device)
    if draws_elsewhere:
        move_dense_part(dlrm, dense_device)  # type: ignore[arg-type]
    if dropout > 0:
        add_over_arch_dropout(dlrm, dropout)
    return (WeightedDLRMTrain if weighted else DLRMTrain)(dlrm)  # type: ignore[arg-type]
