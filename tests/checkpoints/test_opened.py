"""checkpoints/opened.py: one verified open of a checkpoint serves every reader.

The reads are counted by a real probe, not a stand-in: an audit hook (PEP 578) sees
every file the process opens, so an export that read COMPLETE, meta.json or
``.metadata`` again would be seen whichever function did it; the unpicklings of
``.metadata`` are counted by wrapping the one function that unpickles it
(`checkpoints.dcp_metadata.load_metadata`, the real one still doing the work).
"""

import contextlib
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.metadata import Metadata

import checkpoints.opened
from checkpoints.dcp_metadata import load_metadata
from checkpoints.directory import COMPLETE_MARKER, DCP_METADATA_FILE, META_FILE
from checkpoints.errors import CheckpointError
from checkpoints.load import check_stored_shapes, load_checkpoint
from checkpoints.opened import OpenedCheckpoint, open_checkpoint, read_meta
from models import build_dlrm_train
from serving import export
from tests.support.exported_model import tiny_checkpoint

_recording: list[Counter] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _recording:
        return
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _recording[-1][("open", os.path.basename(os.fsdecode(args[0])))] += 1


sys.addaudithook(_audit)  # hooks cannot be removed: this one records only inside `reads`


@pytest.fixture
def reads(monkeypatch) -> Callable[[], contextlib.AbstractContextManager[Counter]]:
    """A context that counts, while inside, the opens of each file name and the
    unpicklings of DCP metadata."""

    def unpickling(data: bytes, source: str) -> Metadata:
        if _recording:
            _recording[-1]["unpickle .metadata"] += 1
        return load_metadata(data, source)

    monkeypatch.setattr(checkpoints.opened, "load_metadata", unpickling)

    @contextlib.contextmanager
    def counting() -> Iterator[Counter]:
        counts: Counter = Counter()
        _recording.append(counts)
        try:
            yield counts
        finally:
            _recording.pop()

    return counting


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return tiny_checkpoint(tmp_path_factory.mktemp("opened"), "opened")


def test_the_probe_sees_every_reading(checkpoint, reads):
    """Positive control: two readers started from the path each read the files again."""
    state = {
        "model": build_dlrm_train(
            read_meta(checkpoint).model, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu")
        ).state_dict()
    }
    with reads() as counts:
        check_stored_shapes(checkpoint, state)
        load_checkpoint(checkpoint, state, rank=0, restore_rng=False)
    assert counts[("open", COMPLETE_MARKER)] == 2
    assert counts[("open", DCP_METADATA_FILE)] == 2
    assert counts["unpickle .metadata"] == 2


def test_one_export_reads_the_manifest_and_the_metadata_once(checkpoint, tmp_path, capsys, reads):
    """Issue 39: the export opened COMPLETE four times and unpickled .metadata twice."""
    with reads() as counts:
        assert export.main(["--checkpoint", checkpoint, "--output", str(tmp_path / "model"), "--quantize", "none"]) == 0
    assert f"exported {checkpoint} (step 1)" in capsys.readouterr().out
    assert counts[("open", COMPLETE_MARKER)] == 1
    assert counts[("open", META_FILE)] == 1
    assert counts[("open", DCP_METADATA_FILE)] == 1
    assert counts["unpickle .metadata"] == 1


def test_readers_share_one_opening(checkpoint, reads):
    """The shape check and the load of one OpenedCheckpoint read nothing twice, and each
    still checks .metadata against the state it is handed."""
    with reads() as counts:
        opened = open_checkpoint(checkpoint)
        model = build_dlrm_train(
            opened.meta.model, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu")
        )
        state = {"model": model.state_dict()}
        check_stored_shapes(opened, state)
        load_checkpoint(opened, state, rank=0, restore_rng=False)
    assert counts[("open", COMPLETE_MARKER)] == 1
    assert counts[("open", META_FILE)] == 1
    assert counts[("open", DCP_METADATA_FILE)] == 1
    assert counts["unpickle .metadata"] == 1
    key = next(iter(state["model"]))
    wrong = {"model": {**state["model"], key: torch.zeros(3, 3)}}
    with pytest.raises(CheckpointError, match=rf"\.metadata: model\.{key} has shape \[.*\] there, \[3, 3\] in this"):
        load_checkpoint(opened, wrong, rank=0, restore_rng=False)


def test_opening_refuses_what_is_not_a_complete_checkpoint(checkpoint, tmp_path):
    with pytest.raises(CheckpointError, match=r"nowhere: no such directory$"):
        open_checkpoint(str(tmp_path / "nowhere"))
    partial = tmp_path / "step_000000002"
    partial.mkdir()
    with pytest.raises(CheckpointError, match=r"step_000000002 is incomplete \(no COMPLETE marker\)"):
        open_checkpoint(str(partial))
    assert isinstance(open_checkpoint(checkpoint), OpenedCheckpoint)
