"""Writes serving/exported_operators.json: what the models this project exports use.

    python scripts/exported_operators.py           # prints the lists
    python scripts/exported_operators.py --write   # replaces serving/exported_operators.json
    python scripts/exported_operators.py --check   # exit 1 when it is out of date

Exports a tiny model of every variant a user can train (each interaction, with and
without numerical features, one-hot, multi-hot and padded (Parquet) features; each
sequence interaction over a history feature) in every precision ``python -m
serving.export`` writes (fp32, fp16, int8 torch.export programs; fp32 of a model with
history features),
and collects, without loading them, the operators their graph nodes call
(serving/model_files.py reads archives the same way). The loaders refuse a program
that calls anything else: the list follows the exporter, not the attacks seen.
"""

import argparse
import itertools
import json
import os
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Sequence

import torch

from common.cli import OneLineParser
from models import build_dlrm_train
from models.config import INTERACTION_TYPES, ModelConfig
from models.interactions.dcn import DCNConfig
from models.interactions.projection import ProjectionConfig
from models.sequence_interactions import SEQUENCE_INTERACTIONS
from serving.export import QUANTIZED_DTYPES, fp32_program, quantized_program, save_program
from serving.inference_model import ProbabilityModel, SequenceProbabilityModel
from serving.model_files import ALLOWED_REFERENCES_FILE, TORCH_EXPORT_FORMAT, program_targets

# Three features: enough for every interaction; hotness 1, 3, 2 for the multi-hot variants
# (padded: bags of any length up to it, as a model trained on Parquet).
FEATURES = ["a", "b", "c"]
HOTNESS = {"one-hot": ([1, 1, 1], False), "multi-hot": ([1, 3, 2], False), "padded": ([1, 3, 2], True)}
DENSE_FEATURES = (2, 0)  # with numerical features, and categorical features only
# Tiny interaction sizes (the operators do not depend on them); an interaction not
# named here is exported with its defaults.
TINY_INTERACTIONS = {
    "dcn": DCNConfig(dcn_num_layers=1, dcn_low_rank_dim=2),
    "projection": ProjectionConfig(interaction_branch1_layer_sizes=[8, 8], interaction_branch2_layer_sizes=[8, 8]),
}


def variant_models() -> dict[str, tuple[ProbabilityModel, int]]:
    """A tiny model of every variant and its number of numerical features, by a name
    saying which variant."""
    models = {}
    for interaction, dense, (hot_name, (hotness, padded)) in itertools.product(
        INTERACTION_TYPES, DENSE_FEATURES, HOTNESS.items()
    ):
        config = ModelConfig(
            num_embeddings_per_feature=[10, 20, 30],
            sparse_feature_names=FEATURES,
            dense_in_features=dense,
            embedding_dim=4,
            dense_arch_layer_sizes=[8, 4],
            over_arch_layer_sizes=[8, 1],
            interaction_type=interaction,
            interaction=TINY_INTERACTIONS.get(interaction),
        )
        torch.manual_seed(0)
        train = build_dlrm_train(config, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"))
        name = f"{interaction}, {'dense' if dense else 'no dense'}, {hot_name}"
        models[name] = (ProbabilityModel(train.model, FEATURES, hotness, padded=padded).eval(), dense)
    for sequence_interaction, (hot_name, (hotness, padded)) in itertools.product(
        SEQUENCE_INTERACTIONS, [("one-hot", HOTNESS["one-hot"]), ("padded", HOTNESS["padded"])]
    ):
        config = ModelConfig(
            num_embeddings_per_feature=[10, 20, 30],
            sparse_feature_names=FEATURES,
            dense_in_features=2,
            embedding_dim=4,
            dense_arch_layer_sizes=[8, 4],
            over_arch_layer_sizes=[8, 1],
            sequence_interaction=sequence_interaction,
            sequence_columns=["h:c"],
            max_history=3,
        )
        torch.manual_seed(0)
        train = build_dlrm_train(config, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"))
        model = SequenceProbabilityModel(train.model, FEATURES, hotness, concatenated_tables=True, padded=padded)
        models[f"original, history by {sequence_interaction}, {hot_name}"] = (model.eval(), 2)
    return models


def emitted_references() -> dict[str, list[str]]:
    """Format -> the sorted names every exported variant uses (the file's contents)."""
    found: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchrec's notices, every export
        for model, dense in variant_models().values():
            example: tuple[torch.Tensor, ...] = (
                torch.zeros(4, dense),
                torch.zeros(4, sum(model.hotness), dtype=torch.int64),
            )
            if isinstance(model, SequenceProbabilityModel):  # 2 ids a row's history; fp32 only
                example += (torch.zeros(8, dtype=torch.int64), torch.full((4, 1), 2, dtype=torch.int64))
                programs = [fp32_program(model, example)]
            else:
                programs = [fp32_program(model, example)]
                programs += [quantized_program(model, dtype, example) for dtype in QUANTIZED_DTYPES.values()]
            for program in programs:
                path = os.path.join(tmp, "program.pt2")
                save_program(program, path)
                with zipfile.ZipFile(path) as archive:
                    found |= program_targets(archive)
    return {TORCH_EXPORT_FORMAT: sorted(found)}


def file_text(references: dict[str, list[str]]) -> str:
    """The JSON file: one name a line, so that a change reads as a diff of names."""
    return json.dumps(references, indent=1) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"replace {ALLOWED_REFERENCES_FILE}")
    action.add_argument("--check", action="store_true", help="exit 1 when the file is out of date")
    args = parser.parse_args(argv)
    text = file_text(emitted_references())
    if args.write:
        with open(ALLOWED_REFERENCES_FILE, "w") as f:
            f.write(text)
    elif args.check:
        with open(ALLOWED_REFERENCES_FILE) as f:
            if f.read() != text:
                print(
                    f"{ALLOWED_REFERENCES_FILE} is out of date: run python scripts/exported_operators.py --write",
                    file=sys.stderr,
                )
                return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
