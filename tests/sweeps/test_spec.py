"""What a sweep file expands to (grids, named values, zipped flags, seeds, random
search), its one-line refusals, and results.md's ranking and seed statistics, in
process from synthetic results (no training)."""

import statistics

import pytest

from sweeps.results import COLUMNS, format_markdown
from sweeps.run_state import FAILED, SUCCEEDED, RunRecord
from sweeps.spec import SweepError, parse_sweep

BASE = {
    "name": "tiny",
    "script": "dlrm_main.py",
    "scheduler": "local_cwd",
    "nnodes": 1,
    "nproc_per_node": 2,
    "output_dir": "out",
    "flags": {"batch_size": 256},
}
RANDOM = {
    "search": "random",
    "trials": 5,
    "space": {
        "learning_rate": {"log_uniform": [0.001, 0.1]},
        "embedding_dim": {"choice": [8, {"name": "wide", "value": 64}]},
        "dropout": {"uniform": [0.0, 0.5]},
        "dense_arch_layer_sizes": {"choice": [[16, 8], [32, 8]]},
        "limit_train_batches": {"int": [10, 12]},
    },
}


def expand(**keys):
    return [(run.name, run.flags, run.config) for run in parse_sweep({**BASE, **keys}, "s.yaml").runs()]


def test_named_values_zip_and_seeds_expand_to_exactly_these_runs():
    runs = expand(
        grid={"embedding_dim": [8, {"name": "wide", "value": 64}]},
        zip={"learning_rate": [0.05, 0.1], "over_arch_layer_sizes": [{"name": "small", "value": [16, 1]}, [32, 1]]},
        seeds=[0, 3],
    )
    expected = []
    for dim_name, dim in (("8", 8), ("wide", 64)):
        for lr, over_name, over in ((0.05, "small", [16, 1]), (0.1, "32,1", [32, 1])):
            config = f"embedding_dim={dim_name},learning_rate={lr},over_arch_layer_sizes={over_name}"
            for seed in (0, 3):
                expected.append(
                    (
                        f"{config},seed={seed}",
                        {
                            "batch_size": 256,
                            "embedding_dim": dim,
                            "learning_rate": lr,
                            "over_arch_layer_sizes": over,
                            "seed": seed,
                        },
                        config,
                    )
                )
    assert runs == expected


def test_a_plain_grid_is_the_product_in_file_order_without_configs():
    assert [
        name
        for name, _, config in expand(grid={"embedding_dim": [8, 16], "max_table_rows": [100, None]})
        if config is None
    ] == [
        "embedding_dim=8,max_table_rows=100",
        "embedding_dim=8,max_table_rows=none",
        "embedding_dim=16,max_table_rows=100",
        "embedding_dim=16,max_table_rows=none",
    ]


def test_zip_alone_varies_its_flags_together():
    assert [
        flags for _, flags, _ in expand(zip={"learning_rate": [0.05, 0.1], "batch_size": [128, 512]}, flags={})
    ] == [{"learning_rate": 0.05, "batch_size": 128}, {"learning_rate": 0.1, "batch_size": 512}]


def test_random_search_draws_the_same_trials_from_the_same_file_within_their_distributions():
    runs = expand(**RANDOM)
    assert runs == expand(**RANDOM)  # a file always expands to the same trials
    assert runs != expand(**RANDOM, search_seed=1)
    assert [name.split(",")[0] for name, _, _ in runs] == [f"trial={i}" for i in range(1, 6)]
    for name, flags, _ in runs:
        assert 0.001 <= flags["learning_rate"] <= 0.1 and 0.0 <= flags["dropout"] <= 0.5
        assert flags["learning_rate"] == float(f"{flags['learning_rate']:.4g}")  # the value its name shows
        assert f"learning_rate={flags['learning_rate']}" in name
        assert flags["embedding_dim"] in (8, 64) and ("embedding_dim=wide" in name) == (flags["embedding_dim"] == 64)
        assert flags["dense_arch_layer_sizes"] in ([16, 8], [32, 8])
        assert flags["limit_train_batches"] in (10, 11, 12)
    # The draws themselves (random.Random(0).random(), one per flag per trial), pinned so
    # that a change in how a file expands is seen.
    assert runs[0][0] == (
        "trial=1,learning_rate=0.04885,embedding_dim=wide,dropout=0.2103,"
        "dense_arch_layer_sizes=16,8,limit_train_batches=11"
    )
    with_seeds = expand(**RANDOM, seeds=[0, 1])
    assert [name for name, _, _ in with_seeds[:2]] == [f"{runs[0][0]},seed={s}" for s in (0, 1)]
    assert {config for _, _, config in with_seeds[:2]} == {runs[0][0]}


@pytest.mark.parametrize(
    "keys, message",
    [
        (
            {"grid": {"embedding_dim": [{"name": "a", "value": 8}, {"name": "a", "value": 16}]}},
            "grid.embedding_dim: a name is given twice",
        ),
        ({"grid": {"embedding_dim": [{"name": "a", "value": 8}, 8]}}, "grid.embedding_dim: a value is listed twice"),
        (
            {"grid": {"embedding_dim": [{"name": "a b", "value": 8}]}},
            "grid.embedding_dim: a value's name is letters, digits",
        ),
        (
            {"grid": {"embedding_dim": [{"name": "a", "val": 8}]}},
            "grid.embedding_dim: a named value is {name: ..., value: ...}, got {'name': 'a', 'val': 8}",
        ),
        (
            {"zip": {"learning_rate": [0.1, 0.2], "batch_size": [128]}},
            "zip: its lists vary together and need one length, got learning_rate: 2, batch_size: 1",
        ),
        (
            {"grid": {"learning_rate": [0.1]}, "zip": {"learning_rate": [0.1]}},
            "zip.learning_rate: also varied by grid: give it in one place",
        ),
        ({"grid": {"learning_rate": [0.1]}, "seeds": [0, 0]}, "seeds: a seed is listed twice"),
        ({"grid": {"learning_rate": [0.1]}, "seeds": 3}, "seeds: expected a non-empty list of non-negative integers"),
        ({"grid": {"seed": [1, 2]}, "seeds": [0]}, "grid.seed: also given by seeds: give it in one place"),
        ({"grid": {"learning_rate": [0.1]}, "trials": 4}, "trials: only with search: random"),
        ({"search": "bayes"}, "search: expected one of grid, random, got 'bayes'"),
        ({**RANDOM, "grid": {"batch_size": [1]}}, "grid: not with search: random"),
        ({**RANDOM, "trials": 0}, "trials: expected a positive integer, got 0"),
        ({"search": "random", "space": RANDOM["space"]}, "trials: missing"),
        ({**RANDOM, "space": {"learning_rate": {"normal": [0, 1]}}}, "space.learning_rate: expected one of {choice"),
        (
            {**RANDOM, "space": {"learning_rate": {"log_uniform": [0, 1]}}},
            "space.learning_rate.log_uniform: expected positive bounds, got [0, 1]",
        ),
        (
            {**RANDOM, "space": {"learning_rate": {"uniform": [0.2, 0.1]}}},
            "space.learning_rate.uniform: expected low < high, got [0.2, 0.1]",
        ),
        ({**RANDOM, "space": {"batch_size": {"int": [1, 2.5]}}}, "space.batch_size.int: expected integer bounds"),
        ({**RANDOM, "space": {"batch_size": {"choice": []}}}, "space.batch_size.choice: expected a non-empty list"),
        ({**RANDOM, "search_seed": -1}, "search_seed: expected a non-negative integer, got -1"),
    ],
)
def test_bad_keys_are_one_line_naming_the_file_and_key(keys, message):
    with pytest.raises(SweepError) as caught:
        parse_sweep({**BASE, **keys}, "s.yaml")
    text = str(caught.value)
    assert "\n" not in text and text.startswith("s.yaml: ") and message in text, text


def _record(name, config=None, state=SUCCEEDED):
    return RunRecord(
        index=0,
        name=name,
        directory=f"/out/{name}",
        grid_values={},
        argv=[],
        scheduler="local_cwd",
        ranks=2,
        ranks_per_node=2,
        state=state,
        exit_code=3 if state == FAILED else None,
        error="nan" if state == FAILED else None,
        config=config,
    )


def _row(name, val, test=None, loss=None):
    return {
        **{c: None for c in COLUMNS},
        "run": name,
        "state": SUCCEEDED if val is not None else FAILED,
        "val_auroc": val,
        "test_auroc": test,
        "test_log_loss": loss,
    }


def _table(markdown, heading):
    """{first cell: cells} of the markdown table whose header starts with ``heading``."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {heading} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_results_md_ranks_runs_by_validation_auroc_failed_last():
    rows = [_row("a", 0.70, 0.69, 0.5), _row("b", None), _row("c", 0.75, 0.74, 0.45), _row("d", 0.72, 0.71, 0.47)]
    records = [_record("a"), _record("b", state=FAILED), _record("c"), _record("d")]
    markdown = format_markdown(rows, records)
    assert [row[0] for row in _table(markdown, "Run")] == ["c", "d", "a", "b"]
    assert "Configuration" not in markdown  # no seeds: no per-configuration table
    assert markdown.splitlines()[-1] == "- b diverged (exit code 3): nan"  # 3: a NaN loss (training/failures.py)


def test_results_md_shows_mean_and_standard_deviation_per_configuration_over_seeds():
    results = {
        "lr=0.1": [(0.70, 0.69, 0.50), (0.72, 0.70, 0.48), (0.74, 0.73, 0.46)],
        "lr=0.2": [(0.76, 0.75, 0.44), None, (0.78, 0.77, 0.42)],
    }
    rows, records = [], []
    for config, seeds in results.items():
        for seed, metrics in enumerate(seeds):
            name = f"{config},seed={seed}"
            rows.append(_row(name, *(metrics or (None,))))
            records.append(_record(name, config, SUCCEEDED if metrics else FAILED))
    table = _table(format_markdown(rows, records), "Configuration")
    assert [row[:2] for row in table] == [["lr=0.2", "2/3"], ["lr=0.1", "3/3"]]  # ranked by mean validation AUROC
    for row in table:
        finished = [m for m in results[row[0]] if m]
        for cell, values in zip(row[2:], zip(*finished)):
            assert cell == f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"
    assert [row[0] for row in _table(format_markdown(rows, records), "Run")][:2] == ["lr=0.2,seed=2", "lr=0.2,seed=0"]


def test_the_random_search_example_expands_to_six_trials_times_two_seeds():
    from harness.launch import REPO
    from sweeps.spec import load_sweep

    runs = load_sweep(f"{REPO}/examples/sweeps/random_search.yaml").runs()
    assert len(runs) == 12 and len({run.config for run in runs}) == 6
    assert [run.grid_values["seed"] for run in runs] == [0, 1] * 6


def test_a_runs_configuration_survives_run_json_and_groups_the_report(tmp_path):
    from sweeps.results import collect_rows
    from sweeps.run_state import read_runs
    from sweeps.runner import plan_records

    spec = parse_sweep(
        {**BASE, "output_dir": str(tmp_path), "grid": {"learning_rate": [0.05, 0.1]}, "seeds": [0, 1]}, "s.yaml"
    )
    for record in plan_records(spec, {run.name: ["--seed", str(run.grid_values["seed"])] for run in spec.runs()}):
        record.write()
    records = read_runs(str(tmp_path))  # as `python -m sweeps report` reads them, from run.json
    assert [(r.name, r.config) for r in records] == [
        (f"learning_rate={lr},seed={seed}", f"learning_rate={lr}") for lr in (0.05, 0.1) for seed in (0, 1)
    ]
    table = _table(format_markdown(collect_rows(records), records), "Configuration")
    assert table == [[f"learning_rate={lr}", "0/2", "-", "-", "-"] for lr in (0.05, 0.1)]  # no logs yet
