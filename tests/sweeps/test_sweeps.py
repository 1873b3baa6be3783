"""python -m sweeps for real: a 3-configuration sweep through torchx local_cwd (2 ranks
each), reruns, a failing configuration, Slurm and Kubernetes dry runs, bad sweep files."""

import os
import re

import pytest

from sweeps.run_state import read_runs
from tests.support.sweeps import (
    TINY_FLAGS,
    assert_row_matches_log,
    read_results,
    sweeps,
    sweeps_in_process,
    write_sweep,
)
from tests.support.torchx_cli import kubernetes_job, option, sbatch_groups, torchrun_argv


@pytest.mark.slow
def test_local_sweep_trains_reports_skips_finished_runs_and_reports_a_failure(synthetic_dir, tmp_path):
    # learning rate 1e30: the loss is NaN at the first step (exit code 3), after the
    # sweep's checks, which cannot know.
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        flags={**TINY_FLAGS, "in_memory_binary_criteo_path": synthetic_dir},
        grid={"learning_rate": [0.05, 1.0e30, 0.1]},
    )
    out = str(tmp_path / "out")
    proc = sweeps(["run", sweep])
    assert proc.returncode == 1, proc.stderr[-3000:]  # one run failed
    lines = proc.stdout.splitlines()
    failed = [line for line in lines if line.startswith("[2/3] learning_rate=1e+30: failed")]
    assert failed == [line for line in failed if "(exit code 3): dlrm_main.py: error: training loss is nan" in line]
    assert len(failed) == 1, proc.stdout
    # The failure did not stop the run after it.
    assert "[3/3] learning_rate=0.1: succeeded" in proc.stdout, proc.stdout

    rows = read_results(out)
    assert list(rows) == ["learning_rate=0.05", "learning_rate=1e+30", "learning_rate=0.1"]
    for name in ("learning_rate=0.05", "learning_rate=0.1"):
        assert_row_matches_log(rows[name], os.path.join(out, name, "log.jsonl"))
    assert rows["learning_rate=1e+30"]["state"] == "diverged" and rows["learning_rate=1e+30"]["test_auroc"] == ""
    markdown = open(os.path.join(out, "results.md")).read()
    assert markdown.startswith("| Run | State | Size of embedding tables (GiB) |")
    assert "- learning_rate=1e+30 diverged (exit code 3): dlrm_main.py: error: training loss is nan" in markdown
    with open(os.path.join(out, "results.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in os.listdir(out) if ".tmp" in n]

    # Rerun: the finished runs are skipped, the failed one runs (and fails) again.
    logs_before = {
        n: open(os.path.join(out, n, "log.jsonl")).read() for n in ("learning_rate=0.05", "learning_rate=0.1")
    }
    proc = sweeps(["run", sweep])
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "[1/3] learning_rate=0.05: finished before: skipped" in proc.stdout
    assert "[3/3] learning_rate=0.1: finished before: skipped" in proc.stdout
    assert len(re.findall(r"submitted local_cwd://", proc.stdout)) == 1, proc.stdout
    assert logs_before == {n: open(os.path.join(out, n, "log.jsonl")).read() for n in logs_before}

    status = sweeps(["status", out])
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[-1] == "2 succeeded, 1 failed"
    assert re.search(r"^learning_rate=1e\+30 +failed .* exit code 3: dlrm_main.py: error:", status.stdout, re.M)
    assert [r.state for r in read_runs(out)] == ["succeeded", "failed", "succeeded"]


def _jobs(stdout):
    """{run name: (command, scheduler request)} from `sweeps run --dryrun`."""
    parts = re.split(r"^=== JOB \d+/\d+: (\S+) ===\n", stdout, flags=re.M)[1:]
    jobs = {}
    for name, body in zip(parts[::2], parts[1::2]):
        command, request = body.split("\n=== SCHEDULER REQUEST ===\n", 1)
        jobs[name] = (command, request)
    return jobs


def _training_flags(argv, script):
    """The flags after the entry point, which the ranks run as a module (-m dlrm_main)."""
    return argv[argv.index(script.removesuffix(".py")) + 1 :]


@pytest.mark.slow
def test_slurm_and_kubernetes_dryruns_list_every_job_with_its_flags(tmp_path, capsys):
    grid = {"max_table_rows": [1000, None], "embedding_dim": [16, 64]}
    flags = {"in_memory_binary_criteo_path": "/fsx/criteo", "batch_size": 2048, "mmap_mode": True}
    sweep = write_sweep(
        tmp_path / "slurm.yaml",
        scheduler="slurm",
        nnodes=2,
        nproc_per_node=8,
        scheduler_args={"partition": "train", "time": "1:00:00"},
        component_args={"h": "a100x8"},
        checkpoints=True,
        flags=flags,
        grid=grid,
    )
    code, stdout, stderr = sweeps_in_process(capsys, ["run", "--dryrun", sweep])
    assert code == 0, stderr[-3000:]
    jobs = _jobs(stdout)
    assert list(jobs) == [
        "max_table_rows=1000,embedding_dim=16",
        "max_table_rows=1000,embedding_dim=64",
        "max_table_rows=none,embedding_dim=16",
        "max_table_rows=none,embedding_dim=64",
    ]
    out = tmp_path / "out"
    for (name, (_, request)), (rows, dim) in zip(jobs.items(), [(1000, 16), (1000, 64), (None, 16), (None, 64)]):
        groups = sbatch_groups(request)
        assert len(groups) == 2  # one group per node
        for group in groups:
            assert {"--partition=train", "--time=1:00:00", "--cpus-per-task=96"} <= set(group["options"])
            argv = group["torchrun"]
            assert option(argv, "--nnodes") == "2" and option(argv, "--nproc_per_node") == "8"
            expected = [
                "--checkpoint_dir",
                str(out / name / "checkpoints"),
                "--resume",
                "--in_memory_binary_criteo_path",
                "/fsx/criteo",
                "--batch_size",
                "2048",
                "--mmap_mode",
                *(["--max_table_rows", str(rows)] if rows else []),
                "--embedding_dim",
                str(dim),
                "--log_path",
                str(out / name / "log.jsonl"),
            ]
            assert _training_flags(argv, "dlrm_main.py") == expected
    assert not out.exists()  # a dry run writes nothing

    sweep = write_sweep(
        tmp_path / "k8s.yaml",
        scheduler="kubernetes",
        script="dcnv2_main.py",
        scheduler_args={"namespace": "recsys"},
        component_args={"h": "aws_p4d", "image": "registry.example/dlrm:1"},
        flags=flags,
        grid={"num_embeddings_per_feature": [[10] * 26, [20] * 26]},
    )
    code, stdout, stderr = sweeps_in_process(capsys, ["run", "--dryrun", sweep])
    assert code == 0, stderr[-3000:]
    jobs = _jobs(stdout)
    assert list(jobs) == ["num_embeddings_per_feature=v1", "num_embeddings_per_feature=v2"]
    for (name, (_, request)), rows in zip(jobs.items(), (10, 20)):
        job = kubernetes_job(request)
        assert job["spec"]["queue"] == "default"  # the repository's .torchxconfig
        (task,) = job["spec"]["tasks"]
        (container,) = task["template"]["spec"]["containers"]
        assert container["image"] == "registry.example/dlrm:1"
        argv = torchrun_argv(container["command"])
        assert _training_flags(argv, "dcnv2_main.py") == [
            "--in_memory_binary_criteo_path",
            "/fsx/criteo",
            "--batch_size",
            "2048",
            "--mmap_mode",
            "--num_embeddings_per_feature",
            ",".join([str(rows)] * 26),
            "--log_path",
            str(out / name / "log.jsonl"),
        ]


@pytest.mark.slow
def test_num_embeddings_scale_scales_the_datas_cardinalities(synthetic_dir, tmp_path, capsys):
    from harness.small_data import SMALL_SPEC

    sweep = write_sweep(
        tmp_path / "scale.yaml",
        scheduler="slurm",
        flags={"in_memory_binary_criteo_path": synthetic_dir, "max_table_rows": 1500},
        grid={"num_embeddings_scale": [0.5, 1.0]},
    )
    code, stdout, stderr = sweeps_in_process(capsys, ["run", "--dryrun", sweep])
    assert code == 0, stderr[-3000:]
    jobs = _jobs(stdout)
    assert list(jobs) == ["num_embeddings_scale=0.5", "num_embeddings_scale=1.0"]
    for (command, _), scale in zip(jobs.values(), (0.5, 1.0)):
        sizes = re.search(r"--num_embeddings_per_feature ([\d,]+)", command).group(1)
        assert sizes == ",".join(str(max(1, round(c * scale))) for c in SMALL_SPEC.cardinalities)
        assert "--max_table_rows 1500" in command  # the cap still applies, after scaling


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"grid": {"no_such_flag": [1, 2]}},
            "grid.no_such_flag: unknown training flag (python dlrm_main.py --help lists them)",
        ),
        ({"flags": {"batchsize": 512}}, "flags.batchsize: unknown training flag"),
        ({"flags": {"version": "0.2.0"}}, "flags.version: unknown training flag"),  # it would print and exit
        ({"grid": {}}, "grid: empty: give at least one training flag with a list of values"),
        ({"grid": {"learning_rate": []}}, "grid.learning_rate: expected a non-empty list of values, got []"),
        ({"scheduler": "lsf"}, "scheduler: unknown scheduler 'lsf' (use one of local_cwd, slurm, kubernetes)"),
        (
            {"scheduler_args": {"partitionn": "train"}, "scheduler": "slurm"},
            "scheduler_args.partitionn: not an option of the slurm scheduler",
        ),
        ({"grid": {"learning_rate": [0.05, -1]}}, "run learning_rate=-1: --learning_rate must be positive, got -1"),
        ({"grid": {"seed": ["big"]}}, "run seed=big: argument --seed: invalid int value: 'big'"),
        ({"grid": {"log_path": ["a.jsonl"]}}, "grid.log_path: set by the sweep for every run"),
        ({"zip": {"no_such_flag": [1, 2]}}, "zip.no_such_flag: unknown training flag"),
        (
            {"zip": {"mmap_mode": [1, 2], "batch_size": [128, 256]}, "flags": {}},
            "zip.mmap_mode: an on/off flag: expected true or false, got 1",
        ),
        (
            {"seeds": [0, 1], "flags": {**TINY_FLAGS, "seed": 3}},
            "seeds.seed: also given in flags: give it in one place",
        ),
        ({"component_args": {"cpus": 2}}, "component_args.cpus: not a parameter of the dlrm_main.py component"),
        ({"component_args": {"h": "tpu"}}, "component_args: -h tpu: unknown machine"),
        (
            {"grid": {"num_embeddings_scale": [0.5]}, "flags": {**TINY_FLAGS, "num_embeddings": 10}},
            "grid.num_embeddings_scale: scales the data's cardinalities: do not also give num_embeddings",
        ),
    ],
)
def test_bad_sweep_files_are_refused_in_one_line_and_launch_nothing(tmp_path, capsys, change, message):
    sweep = write_sweep(tmp_path / "bad.yaml", **change)
    code, stdout, stderr = sweeps_in_process(capsys, ["run", sweep])
    assert code == 2
    (line,) = stderr.splitlines()
    assert line.startswith(f"python -m sweeps: error: {sweep}: ") and message in line, line
    assert stdout == "" and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_malformed_yaml_is_refused_naming_line_and_column(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: tiny\ngrid: {learning_rate: [0.05, 0.1]\nscript: dlrm_main.py\n")
    proc = sweeps(["run", str(path)])  # as a user runs it: exits 2 before importing torch
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"python -m sweeps: error: {path}: line 3 column 1: malformed YAML: expected ',' or '}}', but got '<scalar>'"
    ], proc.stderr


@pytest.mark.slow
def test_history_length_and_attention_sizes_are_sweep_keys(tmp_path, capsys):
    """--max_history and the sequence interactions' sizes vary like any training flag,
    checked by the training parser (a bad value: one line naming the run)."""
    grid = {"max_history": [5, 20]}
    zipped = {"sequence_interaction": ["din", "transformer"], "transformer_num_heads": [1, 2]}
    flags = {"sequence_columns": "h3:cat_3", "batch_size": 64, "embedding_dim": 8, "din_attention_layer_sizes": [16, 8]}
    sweep = write_sweep(tmp_path / "seq.yaml", scheduler="slurm", flags=flags, grid=grid, zip=zipped)
    code, stdout, stderr = sweeps_in_process(capsys, ["run", "--dryrun", sweep])
    assert code == 0, stderr[-3000:]
    jobs = _jobs(stdout)
    assert len(jobs) == 4
    name = next(n for n in jobs if "max_history=20" in n and "transformer_num_heads=2" in n)
    argv = _training_flags(sbatch_groups(jobs[name][1])[0]["torchrun"], "dlrm_main.py")
    assert argv[: argv.index("--log_path")] == [
        "--sequence_columns",
        "h3:cat_3",
        "--batch_size",
        "64",
        "--embedding_dim",
        "8",
        "--din_attention_layer_sizes",
        "16,8",
        "--max_history",
        "20",
        "--sequence_interaction",
        "transformer",
        "--transformer_num_heads",
        "2",
    ], argv
    for name, (_, request) in jobs.items():
        _assert_swept_sizes_train(name, _training_flags(sbatch_groups(request)[0]["torchrun"], "dlrm_main.py"))
    bad = write_sweep(tmp_path / "bad.yaml", flags={**TINY_FLAGS, **flags}, grid={"max_history": [5, 0]})
    code, _, stderr = sweeps_in_process(capsys, ["run", "--dryrun", bad])
    assert code == 2
    assert stderr.endswith(f"{bad}: run max_history=0: --max_history must be positive, got 0\n")


def _assert_swept_sizes_train(name, argv):
    """A run's flags as its ranks parse them carry the values its name gives, and the
    model they build (its tables cut to 30 rows) takes a training step on histories
    from empty to longer than --max_history: the swept sizes reach the model."""
    import torch
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from models.builder import build_dlrm_train
    from training.flags import parse_config

    sizes = ["--num_embeddings", "30", "--dense_arch_layer_sizes", "16,8", "--over_arch_layer_sizes", "16,1"]
    config = parse_config([*argv[: argv.index("--log_path")], *sizes], "dlrm_main.py", "")
    values = dict(part.split("=") for part in name.split(","))
    model = config.model
    assert (model.max_history, model.sequence_interaction) == (
        int(values["max_history"]),
        values["sequence_interaction"],
    )
    if model.sequence_interaction == "transformer":  # zipped with din's run, which takes no heads
        assert model.sequence.transformer_num_heads == int(values["transformer_num_heads"])
    else:
        assert model.sequence.din_attention_layer_sizes == [16, 8]
    torch.manual_seed(0)
    train = build_dlrm_train(model, embedding_device=torch.device("cpu"))
    rows, names = 4, model.sparse_feature_names
    lengths = torch.tensor([0, 1, model.max_history, model.max_history + 3])
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=[*names, "h3"],
        values=torch.cat([torch.zeros(rows * len(names), dtype=torch.int64), torch.arange(int(lengths.sum())) % 30]),
        lengths=torch.cat([torch.ones(rows * len(names), dtype=torch.int64), lengths]),
    )
    loss, _ = train(Batch(dense_features=torch.rand(rows, 13), sparse_features=features, labels=torch.ones(rows)))
    loss.backward()
    assert torch.isfinite(loss)
