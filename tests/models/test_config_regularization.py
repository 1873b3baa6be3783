"""Weight decay (dense and embedding, fused and data-parallel tables) against the
optimizers' formulas on one step, and dropout in the over arch."""

import pytest
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

import dlrm_main
from data.binary.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES, SPARSE_FEATURE_NAMES
from harness.launch import launch, read_log, step_losses
from models import build_dlrm_train
from models.config import ModelConfig
from tests.support.model_state import criteo_features, interaction_sizes

LR, EPS, WD, EMB_WD = 0.1, 0.01, 0.3, 0.2
TABLES = ("t_cat_0", "t_cat_20")  # 1000 and 4 rows: most rows untouched, all rows touched
SMALL = [
    "--embedding_dim",
    "8",
    "--dense_arch_layer_sizes",
    "16,8",
    "--over_arch_layer_sizes",
    "16,1",
    "--optimizer",
    "rowwise_adagrad",
    "--dense_optimizer",
    "sgd",
    "--learning_rate",
    str(LR),
    "--eps",
    str(EPS),
    "--batch_size",
    "64",
    "--seed",
    "5",
]


def _one_step(argv):
    """Builds the trainer on one rank, trains one step; returns the weights before and
    after, and the gradients the step left (dense layers, data-parallel tables)."""
    import torch.distributed as dist

    from training.distributed import resolve_env
    from training.flags import parse_config
    from training.trainer import Trainer

    trainer = Trainer(parse_config(argv, "t", ""), resolve_env("cpu"))

    def weights():
        out = {}
        for key, value in trainer.model.state_dict().items():
            local = value.local_shards()[0].tensor if isinstance(value, ShardedTensor) else value
            name = next((t for t in TABLES if f".{t}." in key), None)
            if name or "over_arch" in key:
                out[name or key] = local.detach().clone()
        return out

    before = weights()
    trainer.schedule.apply(trainer.optimizer, 0)
    trainer.train_pipeline.progress(iter(trainer.loaders["train"]))
    grads = {}
    for key, param in trainer.model.named_parameters():
        name = next((t for t in TABLES if f".{t}." in key), None)
        if param.grad is not None and (name or "over_arch" in key):
            grads[name or key] = param.grad.detach().clone()
    after = weights()
    dist.destroy_process_group()
    return before, after, grads


def _rowwise_adagrad_l2(w0, grad, weight_decay):
    """FBGEMM's exact row-wise Adagrad with L2 decay, first step: rows with a gradient
    get g' = g + wd * w, a state of mean(g'^2) and w - lr * g' / (sqrt(state) + eps);
    the other rows do not move."""
    rows = grad.ne(0).any(dim=1, keepdim=True)
    decayed = grad + weight_decay * w0
    state = decayed.pow(2).mean(dim=1, keepdim=True)
    return torch.where(rows, w0 - LR * decayed / (state.sqrt() + EPS), w0)


@pytest.mark.slow
def test_weight_decay_follows_the_optimizers_formulas(synthetic_dir):
    data = ["--in_memory_binary_criteo_path", synthetic_dir, *SMALL]
    decay = ["--weight_decay", str(WD), "--embedding_weight_decay", str(EMB_WD)]
    # The tables' gradients, visible when they are data-parallel and undecayed.
    w0, plain, grads = launch(_one_step, [*data, "--sharding_type", "data_parallel"], nproc=1)[0]
    dp_w0, dp, dp_grads = launch(_one_step, [*data, *decay, "--sharding_type", "data_parallel"], nproc=1)[0]
    for table in TABLES:
        assert torch.equal(w0[table], dp_w0[table])
        expected = _rowwise_adagrad_l2(w0[table], grads[table], EMB_WD)
        torch.testing.assert_close(plain[table], _rowwise_adagrad_l2(w0[table], grads[table], 0.0))
        assert not torch.allclose(expected, plain[table])  # the decay shows
        torch.testing.assert_close(dp[table], expected, rtol=1e-5, atol=1e-6)  # FBGEMM's L2 rule
    assert grads["t_cat_0"].ne(0).any(dim=1).sum() < 1000  # untouched rows exist and kept their weights
    for key, w in dp_w0.items():
        if key not in TABLES:  # dense SGD: w - lr * (g + wd * w)
            torch.testing.assert_close(dp[key], w - LR * (dp_grads[key] + WD * w), rtol=1e-5, atol=1e-7)
            assert not torch.allclose(dp[key], w - LR * dp_grads[key])


@pytest.mark.slow
def test_fused_cpu_tables_refuse_embedding_weight_decay(synthetic_dir, capfd):
    """FBGEMM's fused CPU kernels ignore weight decay: refused on every rank, exit 2."""
    argv = [
        "--in_memory_binary_criteo_path",
        synthetic_dir,
        *SMALL,
        "--embedding_weight_decay",
        "0.1",
        "--sharding_type",
        "table_wise",
    ]
    assert launch(dlrm_main.main, argv) == {0: 2, 1: 2}
    assert (
        "dlrm_main.py: error: --embedding_weight_decay: table t_cat_0 is table_wise on FBGEMM's fused CPU "
        "kernel, which ignores weight decay; on CPU make the tables data-parallel (--sharding_type "
        "data_parallel)"
    ) in capfd.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--embedding_weight_decay", "0.1"],
            "--embedding_weight_decay: FBGEMM's fused sgd kernel has no weight decay "
            "(of the CPU and GPU kernels only rowwise_adagrad has one): use --optimizer rowwise_adagrad",
        ),
        (
            ["--optimizer", "adagrad", "--embedding_weight_decay", "0.1"],
            "--embedding_weight_decay: FBGEMM's fused "
            "adagrad kernel has no weight decay (of the CPU and GPU kernels only rowwise_adagrad has one): "
            "use --optimizer rowwise_adagrad",
        ),
        (["--weight_decay", "-1"], "--weight_decay must not be negative, got -1.0"),
        (["--dropout", "1"], "--dropout must be in [0, 1), got 1.0"),
    ],
)
def test_bad_regularization_flags_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        dlrm_main.main(["--num_embeddings", "100", *argv])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == f"dlrm_main.py: error: {message}"


@pytest.mark.parametrize("interaction", ["original", "dcn", "projection"])
def test_dropout_acts_in_training_only_and_keeps_parameter_names(interaction):
    config = ModelConfig(
        num_embeddings_per_feature=[50] * NUM_SPARSE_FEATURES,
        **criteo_features(),
        embedding_dim=8,
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[32, 16, 1],
        interaction_type=interaction,
        interaction=interaction_sizes(
            interaction,
            dcn_num_layers=1,
            dcn_low_rank_dim=4,
            interaction_branch1_layer_sizes=[16, 16],
            interaction_branch2_layer_sizes=[16, 16],
        ),
    )
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    plain = build_dlrm_train(config, dense_device=cpu, embedding_device=cpu)
    dropped = build_dlrm_train(config, dense_device=cpu, embedding_device=cpu, dropout=0.5)
    assert not any(isinstance(m, torch.nn.Dropout) for m in plain.modules())  # dropout 0: today's model
    assert sum(isinstance(m, torch.nn.Dropout) for m in dropped.modules()) == 2  # after both hidden layers
    assert plain.state_dict().keys() == dropped.state_dict().keys()  # checkpoints load either way
    dropped.load_state_dict(plain.state_dict())
    from data.synthetic.random_data import RandomCriteoLoader

    batch = next(
        iter(
            RandomCriteoLoader(
                num_batches=1,
                batch_size=64,
                rank=0,
                world_size=1,
                num_embeddings_per_feature=[50] * NUM_SPARSE_FEATURES,
                sparse_feature_names=SPARSE_FEATURE_NAMES,
                num_dense_features=NUM_DENSE_FEATURES,
                seed=0,
                stream=0,
            )
        )
    )
    with torch.no_grad():
        plain.eval(), dropped.eval()
        assert torch.equal(plain(batch)[1][1], dropped(batch)[1][1])  # evaluation: no dropout
        plain.train(), dropped.train()
        assert not torch.equal(plain(batch)[1][1], dropped(batch)[1][1])


@pytest.mark.slow
def test_dropout_zero_reproduces_todays_losses(synthetic_dir, tmp_path):
    logs = {name: str(tmp_path / f"{name}.jsonl") for name in ("default", "zero", "half")}
    common = [
        "--in_memory_binary_criteo_path",
        synthetic_dir,
        *SMALL,
        "--limit_train_batches",
        "6",
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "1",
        "--log_every_n_steps",
        "1",
    ]
    for name, extra in (("default", []), ("zero", ["--dropout", "0"]), ("half", ["--dropout", "0.5"])):
        assert launch(dlrm_main.main, [*common, "--log_path", logs[name], *extra], nproc=1) == {0: 0}
    default, zero, half = (step_losses(read_log(logs[n])) for n in ("default", "zero", "half"))
    assert len(default) == 6 and zero == default
    assert half[0] != default[0]  # dropout changes the very first forward
