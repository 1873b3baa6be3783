"""models/interactions/: a new interaction is one file and nothing else. The worked
example of docs/extending.md (`concat`), written as the one file of a
models/interactions/ folder on the path, is taken by the flags, trains, checkpoints
and exports. The torch blocks a module defines on first use (`TorchBlocks`) are its
globals, the old paths' aliases the same objects, and an fx leaf stays one call."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torchrec.fx import symbolic_trace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKER = "<!-- concat interaction: tests/models/test_interactions_registry.py reads this block -->"
TINY = [
    "--num_embeddings",
    "10",
    "--embedding_dim",
    "8",
    "--dense_arch_layer_sizes",
    "16,8",
    "--over_arch_layer_sizes",
    "16,1",
    "--batch_size",
    "32",
    "--limit_train_batches",
    "2",
    "--limit_val_batches",
    "1",
    "--limit_test_batches",
    "1",
]


def test_blocks_are_module_globals_and_the_old_paths_are_gone():
    import importlib

    from models.interactions import dot
    from models.interactions.dot import DotInteraction

    assert DotInteraction is dot.blocks().DotInteraction
    assert DotInteraction.__module__ == "models.interactions.dot"
    with pytest.raises(AttributeError, match="module 'models.interactions.dot' has no attribute 'Nothing'"):
        dot.Nothing
    for old in ("models.interaction", "models.categorical_only"):  # 0.4.0's aliases, removed in 0.5.0
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_the_dot_kernel_is_one_call_in_an_fx_trace():
    """fx (torchrec's pipeline, the quantized export) keeps `dot_interaction`, whose
    autograd.Function it cannot trace, as one call: `TorchBlocks`' fx_leaves."""
    from models.interactions.dot import DotInteraction

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inter_arch = DotInteraction(3)

        def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
            return self.inter_arch(dense, sparse)

    graph = symbolic_trace(Model()).graph
    calls = [node.target.__name__ for node in graph.nodes if node.op == "call_function"]
    assert calls == ["dot_interaction"]


def documented_interaction() -> str:
    """The Python block right after MARKER in docs/extending.md."""
    with open(os.path.join(REPO, "docs", "extending.md")) as f:
        page = f.read()
    assert MARKER in page, "docs/extending.md lost its concat example"
    block = page[page.index(MARKER) + len(MARKER) :].lstrip("\n")
    assert block.startswith("```python\n")
    return block[len("```python\n") : block.index("\n```\n") + 1]


def run(argv: list[str], plugins: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, plugins])},
    )


@pytest.mark.slow
def test_a_new_interaction_is_one_file(tmp_path):
    plugins = tmp_path / "plugins"
    (plugins / "models" / "interactions").mkdir(parents=True)
    (plugins / "models" / "interactions" / "concat.py").write_text(documented_interaction())
    ckpt, model, log = tmp_path / "ckpt", tmp_path / "model", tmp_path / "log.jsonl"

    help_text = run([os.path.join(REPO, "dlrm_main.py"), "--help"], str(plugins), str(tmp_path)).stdout
    assert "{original,dcn,projection,concat}" in help_text

    trained = run(
        [
            os.path.join(REPO, "dlrm_main.py"),
            "--interaction_type",
            "concat",
            *TINY,
            "--checkpoint_dir",
            str(ckpt),
            "--checkpoint_at_epoch_end",
            "--log_path",
            str(log),
        ],
        str(plugins),
        str(tmp_path),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "model: DLRM-concat (concat interaction) | bottom MLP 13-16-8 | top MLP 16-1" in trained.stdout
    [meta_path] = [os.path.join(d, "meta.json") for d, _, files in os.walk(ckpt) if "meta.json" in files]
    with open(meta_path) as f:
        meta = json.load(f)
    assert meta["step"] == 2 and meta["config"]["model"]["interaction_type"] == "concat"

    exported = run(
        ["-m", "serving.export", "--checkpoint", str(ckpt), "--output", str(model)], str(plugins), str(tmp_path)
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert {"fp32.pt2", "inputs.json", "manifest.json"} <= set(os.listdir(model))

    # Without the file the interaction is not there: the folder on the path is what added it.
    refused = run(
        [os.path.join(REPO, "dlrm_main.py"), "--interaction_type", "concat", *TINY],
        str(tmp_path / "elsewhere"),
        str(tmp_path),
    )
    assert refused.returncode == 2
    assert "argument --interaction_type: invalid choice: 'concat'" in refused.stderr
