"""The command lines README.md and docs/benchmarks.md show, run as shown: read from the
pages' ```bash blocks, scaled down by flags the tests set (ranks, tiny data and
models), and checked for what the page says they do."""

import json
import os
import re
import subprocess
import sys

import pytest

from data.synthetic_criteo import SyntheticCriteoSpec, write_raw_days
from harness.launch import REPO, eval_record, read_log
from serving.predict import Predictor
from serving.serve import serving_in_background
from tests.support.doc_commands import bash_commands, markdown_commands, replaced, with_flags

pytestmark = pytest.mark.slow  # every test runs the commands

# The raw day files behind README's /data/criteo_raw: 3 small days, tables of <= 1000 ids.
RAW_SPEC = SyntheticCriteoSpec(
    num_days=3, rows_per_day=6_000, seed=11, cardinalities=[min(c, 1000) for c in SyntheticCriteoSpec().cardinalities]
)
# torchrun's ranks (8 GPUs in the README): one CPU rank keeps the tests light; the
# multi-rank paths are tested elsewhere.
RANKS = 1
# Training scaled down: a small model, a few steps, validation every 5 of them.
SMALL_RUN = [
    "--batch_size",
    "128",
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "64,16",
    "--over_arch_layer_sizes",
    "64,1",
    "--limit_train_batches",
    "20",
    "--validation_freq_within_epoch",
    "5",
    "--limit_val_batches",
    "4",
    "--limit_test_batches",
    "4",
]


def runnable(argv: list[str]) -> list[str]:
    """A documented command as this machine runs it: this venv's python, torchrun on
    RANKS CPU ranks with a free rendezvous port, the entry points of this checkout."""
    scripts = {name: os.path.join(REPO, name) for name in ("dlrm_main.py", "dcnv2_main.py")}
    if argv[0] == "torchrun":
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            *with_flags(argv[1:], ["--nproc_per_node", str(RANKS)]),
        ]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    return replaced(argv, scripts)


def run(argv: list[str], cwd: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        runnable(argv), cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": REPO}
    )
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def readme_commands() -> dict[int, list[list[str]]]:
    """README's "Five command lines", by their number (the comment above each)."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    block = text.split("## Five command lines\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    numbered: dict[int, list[list[str]]] = {}
    for part in re.split(r"^# (\d+)\. .*$", block, flags=re.M)[1:]:
        if part.isdigit():
            number = int(part)
        else:
            numbered[number] = markdown_commands(f"```bash\n{part}```\n")
    return numbered


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """README commands 3 (preprocess raw days) and 1 (train with --checkpoint_dir ckpt
    --resume) in one working directory, the raw days in place of /data/criteo_raw."""
    work = tmp_path_factory.mktemp("readme")
    raw = str(work / "criteo_raw")
    write_raw_days(RAW_SPEC, raw)
    data = str(work / "criteo")
    paths = {"/data/criteo_raw": raw, "/data/criteo": data, "/data/criteo/metadata.json": f"{data}/metadata.json"}
    commands = readme_commands()
    (preprocess,) = commands[3]
    run(with_flags(replaced(preprocess, paths), ["--workers", "2"]), str(work))
    (train,) = commands[1]
    log = str(work / "train.jsonl")
    proc = run(with_flags(replaced(train, paths), [*SMALL_RUN, "--log_path", log]), str(work))
    return {
        "work": str(work),
        "paths": paths,
        "commands": commands,
        "log": read_log(log),
        "output": proc.stdout + proc.stderr,
    }


def test_readme_train_saves_the_best_checkpoint_and_export_takes_it(readme_run):
    """Command 1 alone (no saving flag) leaves checkpoints; command 5 exports the one
    with the best validation AUROC. Before, command 1 saved nothing and export failed."""
    work = readme_run["work"]
    assert "--resume: ckpt holds no complete checkpoint; training starts from scratch" in readme_run["output"]
    validations = [r for r in readme_run["log"] if r["event"] == "eval" and r["stage"] == "validation"]
    assert [r["step"] for r in validations] == [5, 10, 15, 20]
    best = max(validations, key=lambda r: r["auroc"])  # the first of equals, as early stopping keeps it
    with open(os.path.join(work, "ckpt", "best.json")) as f:
        marked = json.load(f)
    assert (marked["checkpoint"], marked["step"]) == (f"step_{best['step']:09d}", best["step"])
    assert os.path.isdir(os.path.join(work, "ckpt", "step_000000020"))  # the end of training
    export = readme_run["commands"][5][0]
    assert export[:3] == ["python", "-m", "serving.export"]
    proc = run(export, work)
    assert f"ckpt/step_{best['step']:09d} (step {best['step']}) to model_dir" in proc.stdout


def test_readme_plan_then_train_with_it(readme_run):
    """Command 4: the GPU plan is made on this GPU-less machine as written; then the CPU
    host's lines, plan for CPU ranks and train with that plan (before, the README had
    only the GPU pair, whose training a CPU host refuses)."""
    work, paths = readme_run["work"], readme_run["paths"]
    gpu_plan, _gpu_train, cpu_plan, train_with_plan = readme_run["commands"][4]
    assert "--hbm_gb" in gpu_plan and tuple(cpu_plan[cpu_plan.index("--compute_device") :][:2]) == (
        "--compute_device",
        "cpu",
    )
    run(replaced(gpu_plan, paths), work)
    with open(os.path.join(work, "plan.json")) as f:
        assert json.load(f)["topology"]["compute_device"] == "cuda"
    run(
        with_flags(
            replaced(cpu_plan, paths), ["--world_size", str(RANKS), "--embedding_dim", "16", "--batch_size", "128"]
        ),
        work,
    )
    log = os.path.join(work, "plan_run.jsonl")
    run(with_flags(replaced(train_with_plan, paths), [*SMALL_RUN, "--log_path", log]), work)
    assert eval_record(read_log(log), "test")["num_samples"] == RANKS * 4 * 128


def test_readme_activates_the_venv_it_runs_in():
    """The line before the five: `source .venv/bin/activate` puts the venv's python and
    torchrun first on PATH (the commands after `make train` need them)."""
    (source,) = [argv for argv in bash_commands("README.md") if argv[0] == "source"]
    if not os.path.exists(os.path.join(REPO, source[1])):
        pytest.skip(f"no {source[1]} in this checkout (another STACK's venv runs the tests)")
    proc = subprocess.run(
        ["bash", "-c", f"source {source[1]} && command -v python torchrun"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    # the venv's own directory (.venv may be a link to it)
    venv_bin = os.path.realpath(os.path.join(REPO, os.path.dirname(source[1])))
    assert [os.path.realpath(os.path.dirname(p)) for p in proc.stdout.split()] == [venv_bin] * 2


def test_readme_parquet_commands(tmp_path):
    """Command 2: generate a day-partitioned Parquet log, train on its past days, test
    on the last (a smaller log and a few steps)."""
    generate, train = readme_commands()[2]
    work = str(tmp_path)
    run(with_flags(generate, ["--days", "3", "--rows_per_day", "3000", "--row_group_rows", "1000"]), work)
    log = str(tmp_path / "log.jsonl")
    proc = run(with_flags(train, [*SMALL_RUN, "--log_path", log]), work)
    records = read_log(log)
    assert "time ranges (date): train 2026-11-01 to before 2026-11-02" in proc.stdout
    assert eval_record(records, "test")["num_samples"] > 0
    startup = next(record for record in records if record["event"] == "startup")
    assert startup["split_rows"]["test"] == 3000  # the last day


def test_benchmarks_quality_gate_lines(tmp_path):
    """docs/benchmarks.md's quality-gate block: generate, train, export, gate, on a
    third of the rows and 30 steps. With the public defaults it ended `training loss
    is nan at step 5`."""
    block = [
        argv
        for argv in bash_commands("docs/benchmarks.md")
        if argv[:3] == ["python", "-m", "data.synthetic_criteo"] and "small" in argv
    ]
    assert len(block) == 1
    start = bash_commands("docs/benchmarks.md").index(block[0])
    generate, train, export, gate = bash_commands("docs/benchmarks.md")[start : start + 4]
    assert gate[:3] == ["python", "-m", "serving.quality_gate"]
    work = str(tmp_path)
    run(with_flags(generate, ["--rows_per_day", "8192"]), work)
    run(with_flags(train, ["--limit_train_batches", "30"]), work)
    run(export, work)
    proc = run(gate, work)
    assert re.search(r"AUROC fp32 0\.\d+", proc.stdout) and "quality gate passed" in proc.stdout, proc.stdout


def test_every_readme_command_is_run_by_a_test():
    """Each command line README.md shows is run here or by the test named beside it: a
    new one needs a test."""
    run_here = [
        ("source", ".venv/bin/activate"),
        ("torchrun",),
        ("python", "-m", "data.synthetic_parquet"),
        ("python", "-m", "data.preprocess_criteo"),
        ("python", "-m", "sharding_plans"),
        ("python", "-m", "serving.export"),
    ]
    run_elsewhere = {
        (
            "make",
            "train",
        ): "tests/training/test_recipes_stable_start.py (its TRAIN_FLAGS on make train's generated data)",
        ("make", "test"): "CI (.ci/run): the suite itself",
        ("python", "-m", "serving.serve"): "tests/serving/test_serve.py (serving an exported model over HTTP)",
    }
    for argv in bash_commands("README.md"):
        assert any(tuple(argv[: len(prefix)]) == prefix for prefix in [*run_here, *run_elsewhere]), argv


def test_serving_curl_json_example_is_answered_by_the_parquet_model_the_page_builds(tmp_path):
    """docs/serving.md's curl line for a Parquet model, run as written against the model
    its Parquet section trains and exports (on data.synthetic_parquet's log, in place of
    the page's table, scaled down). It names six of the model's 41 columns: before, it
    was refused (`request line 1 column I3: missing`); it asks for the others as null."""
    page = bash_commands("docs/serving.md")
    (curl,) = [argv for argv in page if argv[0] == "curl" and any(word.startswith("{") for word in argv)]
    train = next(argv for argv in page if argv[0] == "torchrun" and "--parquet_path" in argv)
    export = next(argv for argv in page[page.index(train) :] if argv[:3] == ["python", "-m", "serving.export"])
    work = str(tmp_path)
    run(
        [
            "python",
            "-m",
            "data.synthetic_parquet",
            "--output_dir",
            train[train.index("--parquet_path") + 1],
            "--days",
            "3",
            "--rows_per_day",
            "3000",
            "--row_group_rows",
            "1000",
        ],
        work,
    )
    run(with_flags(train, [*SMALL_RUN, "--num_embeddings", "1000"]), work)
    run(export, work)
    model = os.path.join(work, export[export.index("--output") + 1])
    with serving_in_background(Predictor(model)) as (url, _):
        proc = run([word.replace("http://127.0.0.1:8080", url) for word in curl], work)
    assert re.fullmatch(r"0\.\d+\n", proc.stdout), proc.stdout


def test_serving_parquet_example_lines(tmp_path):
    """docs/serving.md's Parquet model block, generate to predict, on a smaller log (7
    days of 1,500 rows) and a small model: predict scores the last day, the one the
    run tested on, and finds the trainer's test AUROC. Before, the block read a `log/`
    that nothing generated."""
    commands = bash_commands("docs/serving.md")
    (generate,) = [argv for argv in commands if argv[:3] == ["python", "-m", "data.synthetic_parquet"]]
    start = commands.index(generate)
    train, export, predict = commands[start + 1 : start + 4]
    assert (train[0], export[:3], predict[:3]) == (
        "torchrun",
        ["python", "-m", "serving.export"],
        ["python", "-m", "serving.predict"],
    )
    work = str(tmp_path)
    run(with_flags(generate, ["--rows_per_day", "1500", "--row_group_rows", "500"]), work)
    assert sorted(os.listdir(tmp_path / "log")) == [f"date=2026-11-0{d}" for d in range(1, 8)]
    log = str(tmp_path / "run.jsonl")
    run(with_flags(train, [*SMALL_RUN, "--log_path", log, "--limit_test_batches", "100"]), work)
    test = eval_record(read_log(log), "test")
    run(export, work)
    run(predict, work)
    with open(tmp_path / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["rows"] == 1500 == test["num_samples"]
    assert f"{metrics['auroc']:.4f}" == f"{test['auroc']:.4f}"
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "scores.parquet").schema.names == ["ts", "label", "probability"]
