"""The histogram AUROC (--auroc_bins): within its reported bound of the exact AUROC,
the same over 2 ranks as over the gathered data, and the flag's checks."""

import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from harness.launch import launch
from training.binned_auroc import BinnedAUROC
from training.flags import parse_config
from training.metrics import BinaryClassificationMetrics


def _scores(n: int, seed: int):
    """Logits of a click model: a hidden score plus noise, about 25% positives."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, generator=g)
    labels = (hidden + torch.randn(n, generator=g) * 1.5 > 1.0).int()
    logits = hidden * 1.3 - 1.0
    return logits, labels


@pytest.mark.parametrize("bins", [10, 1000, 100_000])
def test_binned_auroc_is_within_its_bound_of_the_exact_value(bins):
    """The distance to torchmetrics' exact AUROC never exceeds the reported bound,
    and the bound shrinks with the bins (1e-4 at 100k bins for 300k rows)."""
    logits, labels = _scores(300_000, seed=0)
    exact = binary_auroc(torch.sigmoid(logits), labels).item()
    auroc = BinnedAUROC(bins, torch.device("cpu"))
    for part in range(3):  # several updates, as batches arrive
        auroc.update(torch.sigmoid(logits[part::3]), labels[part::3])
    value, bound = auroc.compute()
    assert abs(value - exact) <= bound + 1e-12
    assert bound <= {10: 0.1, 1000: 1e-3, 100_000: 1e-4}[bins]
    assert bound > 0  # pairs share bins: the bound is not vacuous


def test_ties_and_a_single_class():
    """Equal predictions count a half, like the exact AUROC; one class gives NaN."""
    auroc = BinnedAUROC(4, torch.device("cpu"))
    auroc.update(torch.tensor([0.1, 0.1, 0.9, 0.6]), torch.tensor([0, 1, 1, 0]))
    value, bound = auroc.compute()
    exact = binary_auroc(torch.tensor([0.1, 0.1, 0.9, 0.6]), torch.tensor([0, 1, 1, 0])).item()
    assert value == exact == 0.625 and bound == 0.125  # the (0.1, 0.1) pair: a tie in both
    only_negatives = BinnedAUROC(4, torch.device("cpu"))
    only_negatives.update(torch.tensor([0.2, 0.3]), torch.tensor([0, 0]))
    assert all(x != x for x in only_negatives.compute())


def _two_ranks(argv):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    logits, labels = _scores(20_000, seed=1)
    rank = dist.get_rank()
    metrics = BinaryClassificationMetrics(torch.device("cpu"), auroc_bins=int(argv[0]))
    metrics.update(logits[rank::2], labels[rank::2])
    values = metrics.compute()
    dist.destroy_process_group()
    return values


@pytest.mark.slow
def test_two_ranks_sum_their_histograms():
    """Over 2 ranks (real gloo all-reduce) the value is that of all the data on one."""
    per_rank = launch(_two_ranks, ["500"], nproc=2)
    logits, labels = _scores(20_000, seed=1)
    single = BinaryClassificationMetrics(torch.device("cpu"), auroc_bins=500)
    single.update(logits, labels)
    expected = single.compute()
    for values in per_rank.values():
        assert values["auroc"] == expected["auroc"]
        assert values["auroc_error_bound"] == expected["auroc_error_bound"]
        assert values["num_samples"] == 20_000


def test_the_flag_is_checked_and_reaches_the_config(capsys):
    assert parse_config(["--auroc_bins", "1000000"], "dlrm_main.py", "").auroc_bins == 1_000_000
    assert parse_config([], "dlrm_main.py", "").auroc_bins is None
    assert parse_config(["--auroc_bins", str(1 << 24)], "dlrm_main.py", "").auroc_bins == 1 << 24
    # Above 2^24, refused with the flags, before any histogram is allocated (1e12 bins: 16 TB).
    for bins in (1, (1 << 24) + 1, 10**12):
        with pytest.raises(SystemExit) as exit_info:
            parse_config(["--auroc_bins", str(bins)], "dlrm_main.py", "")
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == (
            f"dlrm_main.py: error: --auroc_bins must be in [2, 16777216] (2^24 bins "
            "are as fine as float32 probabilities above 0.5, and hold 256 MiB of "
            f"counts), got {bins}\n"
        )


def test_a_run_with_the_flag_reports_the_binned_auroc_and_its_bound(tmp_path, capsys, monkeypatch):
    """Through the entry point (one process): the evaluation line and record carry the
    bound, and the same run without the flag (exact AUROC) lies within it."""
    import dlrm_main
    from harness.launch import read_log

    for name in ("MASTER_ADDR", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    argv = [
        "--num_embeddings",
        "50",
        "--embedding_dim",
        "4",
        "--dense_arch_layer_sizes",
        "8,4",
        "--over_arch_layer_sizes",
        "8,1",
        "--batch_size",
        "64",
        "--limit_train_batches",
        "2",
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "4",
        "--learning_rate",
        "0.01",
    ]
    tests = []
    for extra in (["--auroc_bins", "100000"], []):
        log = str(tmp_path / f"run{len(tests)}.jsonl")
        assert dlrm_main.main(argv + extra + ["--log_path", log]) == 0
        tests += [r for r in read_log(log) if r["event"] == "eval"]
    binned, exact = tests
    assert "auroc_error_bound" not in exact and binned["num_samples"] == exact["num_samples"] == 256
    assert abs(binned["auroc"] - exact["auroc"]) <= binned["auroc_error_bound"] < 0.01
    out = capsys.readouterr().out
    assert f"test: AUROC {binned['auroc']:.4f} (binned, within {binned['auroc_error_bound']:.1e})" in out
