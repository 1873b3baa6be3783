"""The dense part's speed levers: --compile (torch.compile of the MLPs and interaction)
and --dense_precision bf16 (bf16 autocast), in-process."""

import logging

import pytest
import torch
import torch.distributed as dist

from common.errors import BadInput
from training.distributed import resolve_env
from training.flags import parse_config
from training.pipelines import check_compile_supported, check_dense_precision
from training.trainer import Trainer

TINY_RUN = [
    "--num_embeddings",
    "50",
    "--embedding_dim",
    "4",
    "--dense_arch_layer_sizes",
    "8,4",
    "--over_arch_layer_sizes",
    "8,1",
    "--batch_size",
    "8",
    "--limit_train_batches",
    "6",
    "--limit_val_batches",
    "0",
    "--limit_test_batches",
    "2",
    "--seed",
    "3",
    "--learning_rate",
    "0.5",
]


@pytest.fixture
def one_process(monkeypatch):
    """Single-process runs in this process (an in-memory process group); dynamo's
    compiled code does not outlive the test."""
    for name in ("MASTER_ADDR", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield
    torch._dynamo.reset()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_bf16_is_refused_on_a_cpu_without_bf16_units():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    with pytest.raises(BadInput, match=r"^--dense_precision bf16 \(--amp\) on a CPU without bf16 units"):
        check_dense_precision("bf16", cpu, has_bf16_units=False)
    check_dense_precision("bf16", cpu, has_bf16_units=True)
    check_dense_precision("bf16", cuda, has_bf16_units=False)  # the CPU's units do not matter on a GPU
    check_dense_precision("fp32", cpu, has_bf16_units=False)


@pytest.mark.slow  # Inductor's search runs `g++ --version`
def test_compile_without_a_cpp_compiler_is_one_line(monkeypatch):
    import torch._inductor.config as inductor_config

    check_compile_supported(True)  # this machine has g++
    monkeypatch.delenv("TORCH_INDUCTOR_INSTALL_GXX", raising=False)
    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
        with pytest.raises(
            BadInput, match=r"^--compile: torch.compile's Inductor needs a C\+\+ compiler and found none"
        ):
            check_compile_supported(True)
    check_compile_supported(False)


def test_amp_is_dense_precision_bf16(capsys):
    assert parse_config(TINY_RUN + ["--amp"], "dlrm_main.py", "").dense_precision == "bf16"
    config = parse_config(TINY_RUN + ["--dense_precision", "bf16"], "dlrm_main.py", "")
    assert config.amp and not parse_config(TINY_RUN, "dlrm_main.py", "").amp
    with pytest.raises(SystemExit, match="2"):
        parse_config(TINY_RUN + ["--amp", "--dense_precision", "fp32"], "dlrm_main.py", "")
    assert capsys.readouterr().err == "dlrm_main.py: error: --amp contradicts --dense_precision fp32\n"


def _train(argv):
    trainer = Trainer(parse_config(TINY_RUN + argv, "dlrm_main.py", ""), resolve_env("cpu"))
    return trainer, trainer.fit()


def _local(value):
    """A state dict value as a plain tensor: a table's one shard (one rank), or itself."""
    return value.local_shards()[0].tensor if hasattr(value, "local_shards") else value


# Inductor fuses and reorders the MLPs' elementwise work and reductions: fp32 rounding
# differences, far below a loss's last printed digit (measured: at most 6e-8 over these 6 SGD steps).
COMPILED_LOSS_TOLERANCE = 1e-5


@pytest.mark.slow
@pytest.mark.native  # Inductor compiles C++ kernels: make test-native
def test_compiled_dense_part_trains_like_eager_and_its_checkpoint_loads_without_it(one_process, tmp_path, caplog):
    """--compile under the sparse-dist pipeline: the pipeline still finds (and pipelines)
    the sharded embeddings, the losses are eager's within COMPILED_LOSS_TOLERANCE, the
    state dict keeps its keys, and an eager run loads the compiled run's checkpoint
    and tests it to the same metrics."""
    eager, eager_result = _train(["--checkpoint_dir", str(tmp_path / "eager")])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="torchrec.distributed.train_pipeline.utils"):
        compiled, compiled_result = _train(["--compile", "--checkpoint_dir", str(tmp_path / "compiled")])
    rewrites = [r.getMessage() for r in caplog.records if "pipelined" in r.getMessage()]
    assert set(rewrites) == {"Module 'model.sparse_arch.embedding_bag_collection' will be pipelined"}
    dlrm = compiled.model.module.model
    assert all(block._compiled_call_impl is not None for block in (dlrm.dense_arch, dlrm.inter_arch, dlrm.over_arch))
    assert dlrm.sparse_arch._compiled_call_impl is None  # the embeddings stay eager
    assert len(compiled_result.train_losses) == len(eager_result.train_losses) == 6
    assert compiled_result.train_losses == pytest.approx(eager_result.train_losses, abs=COMPILED_LOSS_TOLERANCE)
    assert list(compiled.model.state_dict()) == list(eager.model.state_dict())

    torch._dynamo.reset()
    checkpoint = compiled._saved_path  # the checkpoint of its last step
    assert checkpoint.startswith(str(tmp_path / "compiled"))
    loaded = Trainer(
        parse_config(TINY_RUN + ["--mode", "test", "--restore_checkpoint_path", checkpoint], "dlrm_main.py", ""),
        resolve_env("cpu"),
    )
    assert loaded.model.module.model.dense_arch._compiled_call_impl is None
    loaded_state = loaded.model.state_dict()
    for name, value in compiled.model.state_dict().items():
        assert torch.equal(_local(loaded_state[name]), _local(value)), name
    assert loaded.evaluate("test") == pytest.approx(compiled_result.test, abs=COMPILED_LOSS_TOLERANCE)
