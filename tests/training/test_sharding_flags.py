"""The entry points' sharding flags: bad constraints and mismatched plan files end in
one line and exit code 2, before any process-group work (so no rank waits)."""

import pytest

import dcnv2_main
import dlrm_main
from harness.launch import run_script
from sharding_plans import cli
from sharding_plans.presets import PRESETS

SMALL = [
    "--num_embeddings",
    "100",
    "--embedding_dim",
    "8",
    "--dense_arch_layer_sizes",
    "16,8",
    "--over_arch_layer_sizes",
    "8,1",
    "--device",
    "cpu",
    "--limit_train_batches",
    "2",
    "--limit_val_batches",
    "0",
    "--limit_test_batches",
    "0",
]


def run_main(capsys, main, argv):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def cpu_plans(tmp_path_factory):
    """{world size: plan file} of the SMALL model for 1 and 2 CPU ranks, made by the CLI."""
    folder = tmp_path_factory.mktemp("plans")
    paths = {}
    for world_size in (1, 2):
        paths[world_size] = str(folder / f"plan{world_size}.json")
        assert (
            cli.main(
                [
                    "plan",
                    "--num_embeddings",
                    "100",
                    "--embedding_dim",
                    "8",
                    "--world_size",
                    str(world_size),
                    "--compute_device",
                    "cpu",
                    "--ddr_gb",
                    "1",
                    "--output",
                    paths[world_size],
                ]
            )
            == 0
        )
    return paths


@pytest.mark.parametrize("main, prog", [(dlrm_main.main, "dlrm_main.py"), (dcnv2_main.main, "dcnv2_main.py")])
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sharding_type", "t_cat_99=row_wise"], "--sharding_type: unknown table 't_cat_99' (tables: t_cat_0, "),
        (["--sharding_type", "diagonal"], "--sharding_type: unknown value 'diagonal'"),
        (["--sharding_type", "t_cat_0="], "--sharding_type: unknown value ''"),
        (["--compute_kernel", "t_cat_0=fast"], "--compute_kernel: unknown value 'fast'"),
        (
            ["--compute_kernel", "fused_uvm"],
            "--compute_kernel: fused_uvm (t_cat_0) needs CUDA, the compute device is cpu",
        ),
        (["--sharding_plan", "plan.json", "--sharding_type", "row_wise"], "--sharding_plan fixes the plan"),
        (["--sharding_plan", "/no/such/plan.json"], "/no/such/plan.json: cannot read the plan file"),
        (
            ["--sharding_plan", PRESETS["mlperf"].plan_path],
            f"{PRESETS['mlperf'].plan_path} is a plan for 8 ranks, this run has 1: plan again with --world_size 1",
        ),
    ],
)
def test_bad_sharding_input_is_one_line_exit_2(capsys, main, prog, argv, message):
    defaults = ["--embedding_dim", "8", "--dense_arch_layer_sizes", "16,8"] if main is dcnv2_main.main else []
    code, lines = run_main(capsys, main, [*SMALL, *defaults, *argv])
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{prog}: error: ") and message in lines[0], lines[0]


def test_plan_of_other_tables_is_refused(capsys, cpu_plans):
    code, lines = run_main(capsys, dlrm_main.main, [*SMALL, "--num_embeddings", "120", "--sharding_plan", cpu_plans[1]])
    assert code == 2 and lines == [
        f"dlrm_main.py: error: {cpu_plans[1]}: table t_cat_0 is 100 x 8 fp32 in the plan, 120 x 8 fp32 in the model"
    ]


@pytest.mark.slow
def test_mismatched_plan_exits_2_on_every_rank(cpu_plans):
    """Under torchrun the plan check fails on both ranks before the process group, so
    neither waits for the other: both exit 2; rank 0 prints the line for the job (unless
    torchrun stopped it first) and torchrun's summary shows it from the error files."""
    proc = run_script(
        ["dlrm_main.py", *SMALL, "--embedding_precision", "fp16", "--sharding_plan", cpu_plans[2]],
        torchrun_nproc=2,
        timeout=120,
    )
    assert proc.returncode != 0
    message = (
        f"dlrm_main.py: error: {cpu_plans[2]}: table t_cat_0 is 100 x 8 fp32 in the plan, 100 x 8 fp16 in the model"
    )
    assert proc.stderr.count(message) <= 1, proc.stderr[-3000:]
    summary = message.replace("dlrm_main.py: error: ", "traceback : dlrm_main.py: ") + " (exit code 2)"
    assert summary in proc.stderr, proc.stderr[-3000:]
