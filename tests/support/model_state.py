"""Helpers shared by test modules: a DCP checkpoint as one flat dict of tensors, exact
comparison of two such states, an MLP's parameter count from first principles, the
model's feature fields for Criteo-shaped data, and an interaction's config from the
interaction flags' values."""

import os
import time
from typing import Any

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from common.config_flags import flags_of
from data.config import DataConfig
from data.sources import RandomData
from models.interactions import INTERACTIONS


def criteo_features() -> dict[str, Any]:
    """ModelConfig's feature fields for Criteo-shaped data, as its source describes
    them (the model itself knows no data set)."""
    features = RandomData(DataConfig()).describe()
    return {
        "sparse_feature_names": list(features.sparse_feature_names),
        "dense_in_features": features.num_dense_features,
    }


def interaction_sizes(interaction: str, **sizes: Any) -> Any:
    """The config of ``interaction`` with the values ``sizes`` gives its flags; the
    values of other interactions' flags are left out, as the command line's are."""
    config_class = INTERACTIONS[interaction].config
    own = {item.field.name for item in flags_of(config_class)}
    return config_class(**{name: value for name, value in sizes.items() if name in own})


def flat_state(checkpoint: str, tmp_path) -> dict:
    out = str(tmp_path / (os.path.basename(checkpoint) + f"-{time.monotonic_ns()}.pt"))
    dcp_to_torch_save(checkpoint, out)
    state = torch.load(out, weights_only=True)

    def flatten(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flatten(v, f"{prefix}{k}.")
            else:
                yield prefix + k, v

    return dict(flatten(state))


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if torch.is_tensor(a[key]):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def mlp_params(in_features: int, sizes: list) -> int:
    total = 0
    for out in sizes:
        total += in_features * out + out
        in_features = out
    return total
