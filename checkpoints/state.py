"""What a checkpoint holds of a run besides its meta.json: the state dict flattened
to the leaves DCP stores, and each process's random generators (rank_<r>.pt), checked
whole before any generator is restored."""

import random
from collections.abc import Iterator
from typing import Any

import torch


def _leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every value of a nested dict that is not itself a dict.
    Empty dicts hold no leaves, so they contribute nothing.

    DCP is handed these leaves, never the nested dicts: its loader turns a dict whose
    values are all empty (a stateless optimizer such as SGD: {"state": {p: {}}})
    into a leaf of its own that the saver never wrote, and the load fails with
    "Missing key". The nested structure comes from the live objects on both sides.
    """
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaves(value, name + ".")
        else:
            yield name, value


def flat_state(state: dict[str, Any]) -> dict[str, Any]:
    """The leaves of a nested state dict under their dotted keys (what DCP stores;
    loading fills them in place)."""
    return dict(_leaves(state))


def rng_state() -> dict[str, Any]:
    """This process's generators: CPU, Python, and its own CUDA device's only (a rank
    uses one device; saving every visible one breaks a resume on a host that shows
    fewer)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device (set per rank)
    return state


def checked_rng_state(state: Any) -> dict[str, Any]:
    """``state`` if it has the kinds, keys and sizes `rng_state` writes (the CUDA state,
    saved on GPU hosts, may be there or not); ValueError naming what differs. Checked
    whole before any generator is set, so a refused file changes none of them."""
    if not isinstance(state, dict) or not {"torch", "python"} <= set(state) <= {"torch", "python", "cuda"}:
        found = sorted(map(repr, state)) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"expected a dictionary of 'torch', 'python' (and 'cuda'), found {found}")
    for key in [key for key in ("torch", "cuda") if key in state]:
        value = state[key]
        if not (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1):
            raise ValueError(f"'{key}' is not a 1-D byte tensor")
    expected_bytes = torch.get_rng_state().numel()
    if state["torch"].numel() != expected_bytes:
        raise ValueError(f"'torch' holds {state['torch'].numel()} bytes, not {expected_bytes}")
    random.Random().setstate(state["python"])  # raises on anything but a generator's state
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
