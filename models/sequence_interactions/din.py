"""Deep Interest Network's target attention (Zhou et al., KDD 2018), registered as
"din": an MLP over [h, c, h - c, h * c] scores each history item h against the
candidate c, and the history's embeddings are summed with these weights.

As in the paper the weights are not normalised (``--din_softmax`` normalises them
over the row's history): their sum carries how much of the history is relevant, not
only which part. Padding positions get weight 0, and a row without history pools to
the zero vector. The hidden layers use PReLU, as the paper's attention unit.

The torch block is defined on the first build (`TorchBlocks`): the flags load this
module without torch.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from common.config_flags import check_layer_sizes, flag
from models.interactions.registry import TorchBlocks
from models.model_sizes import ModelSizes
from models.sequence_interactions.registry import SequenceInteraction, register

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class DINConfig:
    """The attention MLP's sizes (``--sequence_interaction din``)."""

    din_attention_layer_sizes: list[int] = flag(
        [80, 40], help="hidden sizes of DIN's attention MLP over [h, c, h-c, h*c] (a last layer of 1 is added)"
    )
    din_softmax: bool = flag(False, help="normalise DIN's attention weights over the history (the paper does not)")

    def validate(self, model: ModelSizes) -> None:
        check_layer_sizes(self, "din_attention_layer_sizes", self.din_attention_layer_sizes)

    def describe(self) -> str:
        sizes = "-".join(map(str, self.din_attention_layer_sizes))
        return f"DIN attention MLP {sizes}" + (", softmax" if self.din_softmax else "")


def build_din(
    model: ModelSizes, config: DINConfig, max_history: int, dense_device: Optional["torch.device"]
) -> "nn.Module":
    return blocks().DINAttention(
        model.embedding_dim, config.din_attention_layer_sizes, config.din_softmax, dense_device
    )


register(SequenceInteraction(name="din", config=DINConfig, build=build_din))


def define_blocks() -> dict[str, Any]:
    """DIN's attention block (`TorchBlocks` runs this once)."""
    import torch
    from torch import nn

    # Through the module: fx patches its leaf there while tracing.
    from models import sequence_arch

    class DINAttention(nn.Module):
        """sum_i w_i h_i with w_i = MLP([h_i, c, h_i - c, h_i * c]) over the valid positions.

        ``mlp`` holds the weights (their names are the checkpoints'); the forward
        applies them in a cheaper, equal form.

        Args:
            embedding_dim: D.
            layer_sizes: the MLP's hidden sizes; a last linear layer gives the score.
            softmax: normalise the scores over each row's valid positions.
            device: where the weights are made (None: the default device).
        """

        def __init__(
            self, embedding_dim: int, layer_sizes: list[int], softmax: bool, device: torch.device | None = None
        ) -> None:
            super().__init__()
            layers: list[nn.Module] = []
            width = 4 * embedding_dim
            for size in layer_sizes:
                layers += [nn.Linear(width, size, device=device), nn.PReLU(device=device)]
                width = size
            layers.append(nn.Linear(width, 1, device=device))
            self.mlp = nn.Sequential(*layers)
            self.softmax = softmax

        def forward(self, history: torch.Tensor, mask: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
            # The first layer is linear in [h, c, h - c, h * c]: with its weight split in
            # four D-column blocks, W [h, c, h - c, h * c] = (Wh + Wd) h + (Wc - Wd) c +
            # Wp (h * c), and Wp (h * c) = (Wp diag(c)) h. So each row's history goes
            # through one matrix of its own, (Wh + Wd) + Wp diag(c), in one batched
            # matmul: a quarter of the multiply-adds of the concatenated input, which is
            # never built ((B, L, 4D), its backward and the expanded candidate's).
            # Slices, transposes, bmm and add: operators the serving loaders accept in an
            # exported program (serving/exported_operators.json).
            first, *hidden, last = [m for m in self.mlp if isinstance(m, nn.Linear)]
            slopes = [m.weight for m in self.mlp if isinstance(m, nn.PReLU)]
            d = history.shape[-1]
            h_block, c_block = first.weight[:, :d], first.weight[:, d : 2 * d]
            difference, product = first.weight[:, 2 * d : 3 * d], first.weight[:, 3 * d :]
            per_row = (h_block + difference).transpose(0, 1) + candidate.unsqueeze(2) * product.transpose(0, 1)
            shared = nn.functional.linear(candidate, c_block - difference, first.bias)  # (B, H)
            # PReLU's own backward in training; the plain operator in an exported program.
            prelu = sequence_arch.prelu if self.training else nn.functional.prelu
            z = prelu(torch.bmm(history, per_row) + shared.unsqueeze(1), slopes[0])
            for linear, slope in zip(hidden, slopes[1:]):
                z = prelu(linear(z), slope)
            scores = last(z).squeeze(-1)
            weights = sequence_arch.masked_softmax(scores, mask) if self.softmax else scores * mask.to(scores.dtype)
            return torch.bmm(weights.unsqueeze(1), history).squeeze(1)

    return locals()


blocks = TorchBlocks(__name__, define_blocks)
__getattr__ = blocks.module_getattr
