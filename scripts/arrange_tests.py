"""Moves the flat tests/test_*.py files into folders that mirror the packages (issue 39),
once, on the merged tree; then this script and its MAPPING are deleted.

    python -m scripts.arrange_tests --dry-run   # what would move, and what is not mapped
    python -m scripts.arrange_tests             # git mv, __init__.py files, references

The rule (docs/tests.md, "Where a test goes"; tests/test_architecture.py checks it): the
tests of module ``PACKAGE/MODULE.py`` live in ``tests/PACKAGE/test_MODULE.py`` (or
``test_MODULE_ASPECT.py`` when one module's tests are split); the tests that need a
cluster, several hosts, Slurm, torchrun or torchx across processes in ``tests/system/``;
the docs' checks in ``tests/docs/``; the entry points' own (``dlrm_main``) and the
tree's (``test_architecture.py``) stay in ``tests/``.

What it rewrites besides moving: every mention of a moved file in the tracked text files
(``tests/test_X.py``, a bare ``test_X.py``, the module ``tests.test_X``, the Makefile's
``tests/test_hostile_*.py``), the ``__file__``-relative paths of the moved files (one
folder deeper), and tests/data/lr_range_test.json, whose folder becomes data's tests.
CHANGELOG.md is history and keeps the old names.
"""

import os
import re
import subprocess
import sys

from common.cli import OneLineParser

# Old name under tests/ -> new path under tests/.
MAPPING = {
    "test_aoti_export.py": "serving/test_export_aoti.py",
    "test_async_checkpoint.py": "training/test_checkpoint_policy_async.py",
    "test_atomic.py": "common/test_atomic.py",
    "test_baseline.py": "training/test_baseline.py",
    "test_bench_flags.py": "bench/test_bench_flags.py",
    "test_binned_auroc.py": "training/test_binned_auroc.py",
    "test_byo_dataset.py": "data/test_transcode.py",
    "test_calibration.py": "training/test_calibration.py",
    "test_categorical_only.py": "models/test_categorical_only.py",
    "test_charts.py": "common/test_png_figure.py",
    "test_checkpoint.py": "checkpoints/test_store.py",
    "test_checkpoint_chunks.py": "checkpoints/test_store_chunks.py",
    "test_cli_help.py": "common/test_cli_help.py",
    "test_config_flags.py": "common/test_config_flags.py",
    "test_cuda_paths.py": "training/test_pipelines_cuda_paths.py",
    "test_data.py": "data/test_loaders.py",
    "test_data_sources.py": "data/test_sources.py",
    "test_dense_speed.py": "training/test_trainer_dense_speed.py",
    "test_divergence.py": "training/test_divergence.py",
    "test_doc_commands.py": "docs/test_commands.py",
    "test_docs_figures.py": "scripts/test_docs_figures.py",
    "test_docs_links.py": "docs/test_links.py",
    "test_early_stopping.py": "training/test_early_stopping.py",
    "test_embedding_init.py": "training/test_embedding_init.py",
    "test_epoch_boundaries.py": "training/test_trainer_epoch_boundaries.py",
    "test_errors.py": "common/test_errors.py",
    "test_evaluate_checkpoint.py": "training/test_main_evaluate_checkpoint.py",
    "test_export_graph.py": "serving/test_export_graph.py",
    "test_first_steps.py": "training/test_recipes_first_steps.py",
    "test_flags.py": "training/test_flags.py",
    "test_gpu_check.py": "bench/test_gpu_check.py",
    "test_gpu_session.py": "bench/test_gpu_session.py",
    "test_help_defaults.py": "serving/test_serve_help.py",
    "test_hostile_checkpoints.py": "checkpoints/test_store_hostile.py",
    "test_hostile_models.py": "serving/test_model_files_hostile.py",
    "test_inference.py": "serving/test_predict.py",
    "test_inference_byo.py": "serving/test_predict_byo.py",
    "test_install_script.py": "scripts/test_install_script.py",
    "test_library_noise.py": "common/test_library_noise.py",
    "test_lr_finder.py": "training/test_lr_finder.py",
    "test_lr_schedule.py": "training/test_lr_schedule.py",
    "test_matrix.py": "harness/test_matrix.py",
    "test_metrics.py": "training/test_metrics.py",
    "test_mlperf_flags.py": "training/test_flags_mlperf.py",
    "test_models.py": "models/test_interactions.py",
    "test_multi_hot.py": "data/test_multi_hot.py",
    "test_multihost.py": "system/test_multihost.py",
    "test_multihost_slurm.py": "system/test_multihost_slurm.py",
    "test_network_settings.py": "training/test_distributed_network_settings.py",
    "test_node_loss.py": "system/test_node_loss.py",
    "test_parquet_columns.py": "data/test_parquet_columns.py",
    "test_parquet_source.py": "data/test_parquet_source.py",
    "test_parquet_training.py": "data/test_parquet_source_training.py",
    "test_peer_throughput.py": "bench/test_peer_throughput.py",
    "test_plan_memory.py": "training/test_plan_memory.py",
    "test_precision_monitoring.py": "training/test_metrics_precision_monitoring.py",
    "test_preprocess_criteo.py": "data/test_preprocess_criteo.py",
    "test_quality_bench.py": "bench/test_quality.py",
    "test_quantized_programs.py": "serving/test_export_quantized.py",
    "test_regularization.py": "models/test_config_regularization.py",
    "test_release.py": "common/test_version.py",
    "test_reserved_port.py": "harness/test_launch_reserved_port.py",
    "test_rolling_windows.py": "training/test_trainer_rolling_windows.py",
    "test_run_log.py": "training/test_run_log.py",
    "test_sample_weights.py": "training/test_trainer_sample_weights.py",
    "test_save_failures.py": "checkpoints/test_store_save_failures.py",
    "test_score_day.py": "serving/test_predict_score_day.py",
    "test_serve.py": "serving/test_serve.py",
    "test_serve_parquet.py": "serving/test_serve_parquet.py",
    "test_serving_cpp.py": "serving/test_cpp.py",
    "test_serving_files.py": "serving/test_model_files.py",
    "test_serving_flags.py": "serving/test_cli.py",
    "test_sharding_equivalence.py": "training/test_sharding_equivalence.py",
    "test_sharding_flags.py": "training/test_sharding_flags.py",
    "test_sharding_plans.py": "sharding_plans/test_sharding_plans.py",
    "test_slurm_cluster.py": "system/test_slurm_cluster.py",
    "test_stable_start.py": "training/test_recipes_stable_start.py",
    "test_stack_names.py": "scripts/test_stack_names.py",
    "test_sweep_spec.py": "sweeps/test_spec.py",
    "test_sweeps.py": "sweeps/test_sweeps.py",
    "test_synthetic_parquet.py": "data/test_synthetic_parquet.py",
    "test_teardown.py": "test_dlrm_main_teardown.py",
    "test_torchrun_launch.py": "system/test_torchrun_launch.py",
    "test_torchx_components.py": "torchx_components/test_torchx_components.py",
    "test_torchx_launch.py": "system/test_torchx_launch.py",
    "test_training.py": "training/test_trainer.py",
    "test_url_credentials.py": "common/test_url_paths.py",
    "test_wheelhouse.py": "scripts/test_wheelhouse.py",
}

# Flat files that stay where they are: the tree's structure is no one package's.
STAYS = ("test_architecture.py",)

# Data files beside the tests that move with them (old -> new, under tests/).
DATA_FILES = {"data/lr_range_test.json": "training/lr_range_test.json"}

FOLDER_DOCSTRINGS = {
    "system": "Tests of whole deployments: Slurm, several hosts, torchrun and torchx across processes.",
    "docs": "Tests of the pages in docs/ and README.md: their links and the command lines they show.",
}

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def unmapped(root: str) -> list[str]:
    """The flat test files neither moved by MAPPING nor meant to stay: a test added since
    the mapping was written, which needs its line before the move."""
    flat = sorted(n for n in os.listdir(os.path.join(root, "tests")) if n.startswith("test_") and n.endswith(".py"))
    return [name for name in flat if name not in MAPPING and name not in STAYS]


def _module(path: str) -> str:
    return "tests." + path[:-3].replace("/", ".")


def rewrite(text: str, moved: dict[str, str]) -> str:
    """``text`` with every mention of a moved test file or data file in its new place."""
    hostile = [f"tests/{new}" for old, new in sorted(moved.items()) if old.startswith("test_hostile_")]
    text = text.replace("tests/test_hostile_*.py", " ".join(hostile))
    for old, new in DATA_FILES.items():
        text = text.replace(f"tests/{old}", f"tests/{new}")
    names = "|".join(re.escape(old[:-3]) for old in sorted(moved, key=len, reverse=True))
    text = re.sub(rf"\btests/({names})\.py\b", lambda m: f"tests/{moved[m.group(1) + '.py']}", text)
    text = re.sub(rf"(?<![\w/.])({names})\.py\b", lambda m: f"tests/{moved[m.group(1) + '.py']}", text)
    text = re.sub(rf"\btests\.({names})\b", lambda m: _module(moved[m.group(1) + ".py"]), text)
    return text


def deepen(text: str, depth: int) -> str:
    """The ``__file__``-relative paths of a test file moved ``depth`` folders deeper."""
    if depth == 0:
        return text
    up = "os.path.dirname(" * depth
    text = text.replace(
        "os.path.dirname(os.path.dirname(os.path.abspath(__file__)))",
        f"{up}os.path.dirname(os.path.dirname(os.path.abspath(__file__))){')' * depth}",
    )
    text = re.sub(
        r"Path\(__file__\)\.resolve\(\)\.parents\[1\]", f"Path(__file__).resolve().parents[{1 + depth}]", text
    )
    # the recorded range test moves beside its test (DATA_FILES)
    return text.replace(
        'os.path.dirname(__file__), "data", "lr_range_test.json"', 'os.path.dirname(__file__), "lr_range_test.json"'
    )


def tracked_text_files(root: str) -> list[str]:
    names = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    skip = {"CHANGELOG.md", "scripts/arrange_tests.py"}
    found = []
    for name in names:
        path = os.path.join(root, name)
        if name in skip or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" not in data:
            found.append(name)
    return found


def git(root: str, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True)


def arrange(root: str, dry_run: bool) -> int:
    missing = unmapped(root)
    if missing:
        print(f"not in MAPPING (add where each goes): {', '.join(missing)}", file=sys.stderr)
        return 2
    tests = os.path.join(root, "tests")
    moved = {old: new for old, new in MAPPING.items() if os.path.exists(os.path.join(tests, old))}
    if dry_run:
        for old, new in sorted(moved.items()):
            print(f"tests/{old} -> tests/{new}")
        return 0
    for old, new in DATA_FILES.items():  # first: tests/data/ becomes the data package's tests
        if os.path.exists(os.path.join(tests, old)):
            os.makedirs(os.path.dirname(os.path.join(tests, new)), exist_ok=True)
            git(root, "mv", f"tests/{old}", f"tests/{new}")
    for new in sorted(set(moved.values())):
        folder = os.path.dirname(new)
        while folder:
            init = os.path.join(tests, folder, "__init__.py")
            if not os.path.exists(init):
                os.makedirs(os.path.dirname(init), exist_ok=True)
                about = FOLDER_DOCSTRINGS.get(folder, f"Tests of the {folder.replace('/', '.')} package.")
                with open(init, "w") as f:
                    f.write(f'"""{about}"""\n')
                git(root, "add", os.path.relpath(init, root))
            folder = os.path.dirname(folder)
    for old, new in sorted(moved.items()):
        git(root, "mv", f"tests/{old}", f"tests/{new}")
    for name in tracked_text_files(root):
        path = os.path.join(root, name)
        with open(path) as f:
            text = f.read()
        new_path = next((f"tests/{new}" for new in moved.values() if f"tests/{new}" == name), None)
        updated = rewrite(text, moved)
        if new_path:
            updated = deepen(updated, new_path.count("/") - 1)
        if updated != text:
            with open(path, "w") as f:
                f.write(updated)
    print(f"moved {len(moved)} test files; run `pytest --collect-only -q` and compare the count with before")
    return 0


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m scripts.arrange_tests", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the moves and change nothing")
    parser.add_argument("--root", default=REPO, help="the repository to arrange (default: this one)")
    args = parser.parse_args(argv)
    return arrange(args.root, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
