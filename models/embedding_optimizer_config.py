"""The fused embedding optimizer's flags (`EmbeddingOptimizerConfig`), apart from
models/embedding_optimizer.py, which attaches it: this module loads without torch,
so the entry points answer --help before loading it."""

from dataclasses import dataclass

from common.config_flags import FlagError, check_choices, flag, option

EMBEDDING_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")


@dataclass
class EmbeddingOptimizerConfig:
    """The fused embedding optimizer's flags (the sharding planner counts its state's
    memory, the trainer attaches it to the tables)."""

    optimizer: str = flag(
        "sgd", choices=EMBEDDING_OPTIMIZERS, help="fused embedding optimizer", alias=("adagrad", "adagrad")
    )
    learning_rate: float = flag(15.0, help="base learning rate (the dense optimizer's too)")
    eps: float = flag(1e-8, help="epsilon of Adagrad/Adam")
    embedding_weight_decay: float = flag(
        0.0, help="L2 weight decay of the looked-up embedding rows (FBGEMM's L2 mode; --optimizer rowwise_adagrad)"
    )

    def validate(self) -> None:
        """Raises FlagError naming the flag."""
        check_choices(self)
        for name in ("learning_rate", "eps"):
            if not getattr(self, name) > 0:
                raise FlagError(f"{option(self, name)} must be positive, got {getattr(self, name)}")
        decay = option(self, "embedding_weight_decay")
        if not self.embedding_weight_decay >= 0.0:
            raise FlagError(f"{decay} must not be negative, got {self.embedding_weight_decay}")
        if self.embedding_weight_decay > 0 and self.optimizer != "rowwise_adagrad":
            raise FlagError(
                f"{decay}: FBGEMM's fused {self.optimizer} kernel has no weight decay (of the CPU "
                "and GPU kernels only rowwise_adagrad has one): use --optimizer rowwise_adagrad"
            )
