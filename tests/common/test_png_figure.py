"""What the charts decide (labels, ticks, scales, colours), drawn on matplotlib's Agg
backend in-process: the sweep chart, the plan chart and training.report's panels."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgba
from matplotlib.ticker import NullFormatter
from PIL import Image
from torchrec.distributed.types import ShardingPlan

from common.png_figure import drawn_date, png_figure
from sharding_plans.chart import LARGEST_COLOR, OTHER_COLOR, draw_memory, log_memory_axis
from sharding_plans.types import PlannerConfig, RankEstimate, SavedPlan
from sweeps import results
from sweeps.spec import SweepError, parse_sweep
from training import report

GIB = 2**30


@pytest.fixture
def axes():
    fig, ax = plt.subplots(1, 2)
    yield fig, ax
    plt.close(fig)


def _rows(sizes, rates):
    return [
        {"run": f"max_table_rows={n}", "table_gib": g, "test_auroc": 0.7 + i / 100, "records_per_sec": r}
        for i, (n, g, r) in enumerate(zip([100, 1000, 10000, "none"], sizes, rates))
    ]


def test_sweep_points_named_by_value_decades_labelled_records_from_zero(axes):
    _, ax = axes
    results.draw_panels(ax, _rows([0.0005, 0.004, 0.024, 0.044], [9614, 9135, 7351, 9660]))
    for panel in ax:
        assert [t.get_text() for t in panel.texts] == ["100", "1000", "10000", "none"]
        assert panel.get_xscale() == "log"
        assert isinstance(panel.xaxis.get_minor_formatter(), NullFormatter)  # no crowded minor labels
        assert panel.get_title() == "points named by max_table_rows"
    assert ax[1].get_ylim()[0] == 0  # 7,351 vs 9,660 reads as noise, not as a cliff
    assert ax[0].get_ylim()[0] > 0.6  # AUROC keeps its own range


def test_sweep_sizes_within_a_decade_are_linear(axes):
    _, ax = axes
    results.draw_panels(ax, _rows([0.02, 0.03, 0.04, 0.05], [1, 2, 3, 4]))
    assert ax[0].get_xscale() == "linear" and "log" not in ax[0].get_xlabel()


def test_point_label_drops_the_keys():
    assert results.point_label("max_table_rows=100") == "100"
    assert results.point_label("embedding_dim=16,learning_rate=0.1") == "16, 0.1"


def _sweep(grid):
    return parse_sweep(
        {
            "name": "s",
            "script": "dlrm_main.py",
            "scheduler": "local_cwd",
            "nnodes": 1,
            "nproc_per_node": 1,
            "output_dir": "out",
            "grid": grid,
        },
        "s.yaml",
    )


def test_named_grid_values_name_the_runs():
    long_rows = [[100] * 26, [1000] * 26]
    spec = _sweep({"num_embeddings_per_feature": [{"name": "small", "value": long_rows[0]}, long_rows[1]]})
    assert [r.name for r in spec.runs()] == ["num_embeddings_per_feature=small", "num_embeddings_per_feature=v2"]
    assert [r.flags["num_embeddings_per_feature"] for r in spec.runs()] == long_rows
    assert _sweep({"max_table_rows": [100, None]}).runs()[1].name == "max_table_rows=none"


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"name": "a"}, "s.yaml: grid.lr: a named value is {name: ..., value: ...}, got {'name': 'a'}"),
        (
            {"name": "a b", "value": 1},
            "s.yaml: grid.lr: a value's name is letters, digits, '.', '_', '+' or '-', got 'a b'",
        ),
    ],
)
def test_bad_named_values(entry, message):
    with pytest.raises(SweepError) as e:
        _sweep({"lr": [entry, 2]})
    assert str(e.value) == message


def test_a_name_given_twice():
    with pytest.raises(SweepError, match="grid.lr: a name is given twice"):
        _sweep({"lr": [{"name": "a", "value": 1}, {"name": "a", "value": 2}]})


def _plan(gib_per_rank, device="cuda", ddr=None):
    topology = PlannerConfig(
        world_size=len(gib_per_rank),
        local_world_size=len(gib_per_rank),
        compute_device=device,
        batch_size=32,
        hbm_cap_bytes=40 * GIB,
        ddr_cap_bytes=100 * GIB,
    )
    ddr = ddr or [0] * len(gib_per_rank)
    estimates = [
        RankEstimate(rank=r, hbm_bytes=int(g * GIB), ddr_bytes=int(d * GIB), step_time_ms=1.0)
        for r, (g, d) in enumerate(zip(gib_per_rank, ddr))
    ]
    return SavedPlan(topology, {}, ShardingPlan(plan={}), estimates)


def test_plan_chart_small_bars_log_axis_integer_ticks_largest_red():
    fig, ax = plt.subplots()
    draw_memory(ax, _plan([0.3, 19.2, 19.0, 0.001]))
    assert ax.get_yscale() == "log" and ax.get_ylim()[0] < 0.001  # the 1 MiB rank still has a bar
    assert list(ax.get_xticks()) == [0, 1, 2, 3]
    labels = ax.get_xticklabels()
    assert to_rgba(labels[1].get_color()) == to_rgba(LARGEST_COLOR)
    assert to_rgba(labels[0].get_color()) != to_rgba(LARGEST_COLOR)
    filled = [p for p in ax.patches if p.get_fill()]
    assert [to_rgba(p.get_facecolor()) == to_rgba(LARGEST_COLOR) for p in filled] == [False, False, False, True]
    assert filled[3].get_x() + filled[3].get_width() / 2 == 1  # the red bar is rank 1's
    _, names = ax.get_legend_handles_labels()
    legend = ax.get_legend()
    colours = {
        t.get_text(): to_rgba(h.get_facecolor())
        for t, h in zip(legend.get_texts(), legend.legend_handles)
        if hasattr(h, "get_facecolor")
    }
    assert colours["GPU memory (HBM)"] == to_rgba(OTHER_COLOR)  # rank 0 is not the largest: blue in the legend
    assert colours["GPU memory (HBM), largest rank (1)"] == to_rgba(LARGEST_COLOR)
    assert [t.get_text() for t in ax.texts] == ["0.3", "19.2", "19", "0.001"]
    plt.close(fig)


def test_plan_chart_largest_outlined_above_uvm_and_linear_when_bars_show():
    fig, ax = plt.subplots()
    draw_memory(ax, _plan([30, 30, 10], ddr=[1, 25, 0]))
    assert ax.get_yscale() == "linear"
    outline = [p for p in ax.patches if not p.get_fill()]
    assert len(outline) == 1 and outline[0].get_height() == pytest.approx(55)
    assert to_rgba(outline[0].get_edgecolor()) == to_rgba(LARGEST_COLOR)
    plt.close(fig)


def test_log_memory_axis_threshold():
    assert not log_memory_axis([1.0, 2.0], 34.0)  # 1 GiB is 3% of 34 GiB: visible
    assert log_memory_axis([0.5, 2.0], 34.0)
    assert not log_memory_axis([0.0, 2.0], 34.0)  # an empty rank has no bar to show


def _log_lines(run_id, interaction, lr, test_auroc):
    config = {
        "event": "config",
        "run_id": run_id,
        "time": 1.0,
        "log_path": f"{run_id}.jsonl",
        "model": {"interaction_type": interaction, "embedding_dim": 64, "num_embeddings_per_feature": [10, 20]},
        "optim": {"learning_rate": lr},
        "checkpoint": {"checkpoint_dir": run_id},
    }
    train = [
        {
            "event": "train",
            "run_id": run_id,
            "time": 1.0 + s,
            "step": s,
            "loss": 0.6,
            "lr": lr,
            "records_per_sec": 1000.0,
        }
        for s in (10, 20)
    ]
    evals = [
        {"event": "eval", "run_id": run_id, "stage": "validation", "step": 20, "auroc": 0.7},
        {"event": "eval", "run_id": run_id, "stage": "test", "step": 20, "auroc": test_auroc, "log_loss": 0.5},
    ]
    return [config] + train + evals


def _write_log(path, *runs):
    with open(path, "w") as f:
        for lines in runs:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    return str(path)


def test_report_labels_a_dlrm_and_a_dcnv2_run_in_one_log(tmp_path):
    log = _write_log(tmp_path / "log.jsonl", _log_lines("a", "original", 0.05, 0.76), _log_lines("b", "dcn", 0.05, 0.8))
    runs = report.read_runs(log)
    assert report.run_labels(runs) == ["DLRM (test AUROC 0.7600)", "DCNv2 (test AUROC 0.8000)"]
    assert runs[1].summary()["test_auroc"] == 0.8 and runs[1].summary()["test_log_loss"] == 0.5


def test_report_model_defaults_are_the_model_name_model_flags_named_within_a_model(tmp_path):
    dlrm, dcnv2, dcnv2_wide = (
        _log_lines(r, kind, 0.05, 0.7) for r, kind in (("a", "original"), ("b", "dcn"), ("c", "dcn"))
    )
    dcnv2[0]["model"]["embedding_dim"] = 128
    dcnv2_wide[0]["model"]["embedding_dim"] = 256
    log = _write_log(tmp_path / "log.jsonl", dlrm, dcnv2)
    assert report.run_labels(report.read_runs(log)) == ["DLRM (test AUROC 0.7000)", "DCNv2 (test AUROC 0.7000)"]
    log = _write_log(tmp_path / "log.jsonl", dlrm, dcnv2, dcnv2_wide)
    assert report.run_labels(report.read_runs(log)) == [
        "DLRM embedding_dim=64 (test AUROC 0.7000)",
        "DCNv2 embedding_dim=128 (test AUROC 0.7000)",
        "DCNv2 embedding_dim=256 (test AUROC 0.7000)",
    ]


def test_report_labels_name_the_flags_that_differ(tmp_path):
    log = _write_log(
        tmp_path / "log.jsonl",
        _log_lines("a", "original", 0.05, 0.7),
        _log_lines("b", "original", 0.1, 0.7),
        _log_lines("c", "original", 0.1, 0.7),
    )
    labels = report.run_labels(report.read_runs(log))
    # log_path and checkpoint_dir differ too but say nothing about the model
    assert labels == [
        "DLRM learning_rate=0.05 (test AUROC 0.7000)",
        "DLRM learning_rate=0.1 #1 (test AUROC 0.7000)",
        "DLRM learning_rate=0.1 #2 (test AUROC 0.7000)",
    ]


def test_report_names_the_model_of_each_test_figure(tmp_path):
    """A run that tested its final weights, then the best checkpoint (the one export
    takes): the legend and the printed figures say which is which."""
    lines = _log_lines("a", "original", 0.05, 0.7)
    final = {**lines[-1], "step": 20, "auroc": 0.62, "model": "final", "exported": False}
    best = {**lines[-1], "step": 10, "auroc": 0.66, "model": "best", "exported": True}
    (run,) = report.read_runs(_write_log(tmp_path / "log.jsonl", lines[:-1] + [final, best]))
    assert report.run_labels([run]) == ["DLRM (test AUROC 0.6600, best, step 10, the one export takes)"]
    assert run.tests_text() == "test AUROC 0.6600 (best, step 10, the one export takes); 0.6200 (final, step 20)"
    # One test without a choice (no checkpoint directory, no best kept): as before.
    plain = {**lines[-1], "model": None, "exported": False}
    (run,) = report.read_runs(_write_log(tmp_path / "plain.jsonl", lines[:-1] + [plain]))
    assert report.run_labels([run]) == ["DLRM (test AUROC 0.7000)"] and run.tests_text() == "test AUROC 0.7000"
    bad = {**lines[-1], "model": "latest", "exported": True}
    with pytest.raises(
        report.LogError,
        match=r"plain.jsonl line \d+: \"model\" is 'latest', expected one of final, best, newest or null",
    ):
        report.read_runs(_write_log(tmp_path / "plain.jsonl", lines[:-1] + [bad]))


def test_report_log_without_config_keeps_its_run_id(tmp_path):
    lines = [line for line in _log_lines("a", "original", 0.05, 0.7) if line["event"] != "config"]
    assert report.run_labels(report.read_runs(_write_log(tmp_path / "old.jsonl", lines))) == [
        "old.jsonl:a (test AUROC 0.7000)"
    ]


def test_report_legend_under_the_panels_and_dated(tmp_path):
    log = _write_log(tmp_path / "log.jsonl", _log_lines("a", "original", 0.05, 0.76), _log_lines("b", "dcn", 0.05, 0.8))
    runs = report.read_runs(log)
    fig, axes = plt.subplots(2, 3)
    report.draw_panels(fig, axes, runs)
    assert all(ax.get_legend() is None for ax in axes.flat)  # nothing over the data
    [legend] = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == report.run_labels(runs)
    plt.close(fig)
    output = str(tmp_path / "run.png")
    report.draw(runs, output)
    assert Image.open(output).size == (1200, 800)


def test_report_rolling_windows_get_a_row_of_per_window_panels(tmp_path):
    lines = [line for line in _log_lines("a", "original", 0.05, 0.7) if line["event"] != "eval"]
    lines += [
        {
            "event": "eval",
            "run_id": "a",
            "stage": "validation",
            "step": 10 * w,
            "window": w,
            "auroc": 0.6 + w / 100,
            "ne": 0.9,
            "calibration": 1.0 + w / 10,
        }
        for w in (1, 2, 3)
    ]
    runs = report.read_runs(_write_log(tmp_path / "log.jsonl", lines))
    assert runs[0].window_auroc == [(1, 0.61), (2, 0.62), (3, 0.63)]
    assert runs[0].validation_auroc == [(10, 0.61), (20, 0.62), (30, 0.63)]
    fig, axes = plt.subplots(3, 3)
    report.draw_panels(fig, axes, runs)
    window_panel = axes[2][0]
    assert window_panel.get_title() == "AUROC of each window"
    assert list(window_panel.lines[0].get_xdata()) == [1, 2, 3]
    assert window_panel.get_xlabel() == "window (trained on the windows before it)"
    plt.close(fig)
    output = str(tmp_path / "run.png")
    report.draw(runs, output)
    assert Image.open(output).size == (1200, 1200)


def test_png_figure_writes_the_date(tmp_path):
    captured = {}
    with png_figure(str(tmp_path / "a.png"), 1, 1) as (fig, _):
        captured["fig"] = fig
    assert [t.get_text() for t in captured["fig"].texts] == [f"drawn {drawn_date()} (UTC)"]


def test_plan_chart_empty_rank_on_a_log_axis_is_labelled_on_the_axis():
    fig, ax = plt.subplots()
    draw_memory(ax, _plan([0.0, 0.001, 19.0]))
    assert ax.get_yscale() == "log"
    assert ax.texts[0].get_text() == "0" and ax.texts[0].xy[1] == ax.get_ylim()[0]
    plt.close(fig)
