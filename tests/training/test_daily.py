"""python -m training.daily: the uninterrupted loop's pointer, models, deltas, seen-id
filters and progressive figures; the loop SIGKILLed at 10 random points (mid-train,
mid-export, mid-gate, mid-promote), rerun after each, ends with the same bytes; a late
day reported; the refusals.

The lake: 4 days of data.synthetic_parquet, 128 rows each (4 training steps of 32
rows). The loops run as programs (`python -m training.daily`, each day's training,
export, gate and scoring a subprocess of it); the refusals and the late day run in
this process, on state files that need no training. Times on a 2-core machine busy
with other work: the uninterrupted loop 250 s (356 s busier), the 10 kills and reruns
510 s (573 s); the refused warm start and the delta on a replaced base 20 s each.
"""

import filecmp
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.parquet.id_sketch import SKETCH_FILE
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.launch import REPO, read_log
from serving import export
from serving.delta import SKETCH_DELTA_FILE
from serving.predict import Predictor
from training import daily, report

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
LAKE = SyntheticParquetSpec(days=4, rows_per_day=128, files_per_day=1, row_group_rows=64, multi_hot_columns=0, seed=3)
TRAINING = [
    "--dense_columns",
    "I*",
    "--sparse_columns",
    "C*",
    "--num_embeddings",
    "50",
    "--embedding_dim",
    "8",
    "--dense_arch_layer_sizes",
    "16,8",
    "--over_arch_layer_sizes",
    "16,1",
    "--batch_size",
    "32",
    "--optimizer",
    "adagrad",
    "--learning_rate",
    "0.05",
    "--seed",
    "3",
    "--device",
    "cpu",
    "--checkpoint_every_n_steps",
    "2",
]


def argv(state_dir, lake) -> list[str]:
    return ["--state_dir", str(state_dir), "--parquet_path", str(lake), "--time_column", "date", "--quantize", "none"]


def run_loop(state_dir, lake, kill: "Kill | None" = None, flags: list[str] = TRAINING) -> "Ran":
    """The loop as a program (``flags``: its training flags), its stdout's lines timed as
    they come; with ``kill``, the loop (alone, or with its steps' processes: its process
    group) gets SIGKILL once it starts the step ``kill`` names, or a later one,
    ``kill.after_s`` seconds after."""
    env = {**os.environ, "PYTHONPATH": REPO, "PYTHONUNBUFFERED": "1", daily.PAUSE_ENV: str(PAUSE_S)}
    command = [sys.executable, "-m", "training.daily", *argv(state_dir, lake), *flags]
    start = time.monotonic()
    child = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(child.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    lines: list[tuple[float, str]] = []
    killer = None
    for line in child.stdout:  # type: ignore[union-attr]
        lines.append((time.monotonic() - start, line.rstrip("\n")))
        step = _step_of(line)
        if kill is not None and killer is None and step is not None and step >= kill.step:
            target = -child.pid if kill.group else child.pid
            killer = threading.Timer(kill.after_s, _kill, (target,))
            killer.start()
    child.wait(timeout=900)
    reader.join()
    if killer is not None:
        killer.cancel()
    return Ran(child.returncode, lines, "".join(err), time.monotonic() - start)


@dataclass
class Ran:
    returncode: int
    lines: list[tuple[float, str]]  # (seconds since the start, a line of stdout)
    stderr: str
    seconds: float

    @property
    def stdout(self) -> str:
        return "\n".join(line for _, line in self.lines)


@dataclass(frozen=True)
class Kill:
    step: tuple[str, int]  # (day, the step's index in STEPS)
    after_s: float
    group: bool  # the loop's process group, or the loop alone (its steps die with it)


# The loop's steps, as its stdout announces them ("2026-11-02: exporting").
STEPS = ("training", "exporting", "gating", "promoting")
PAUSE_S = 0.5  # the promote step's window between the link and its record (daily.PAUSE_ENV)


def _step_of(line: str) -> tuple[str, int] | None:
    match = re.match(r"(\d{4}-\d\d-\d\d): (training|exporting|gating|promoting)\b", line)
    return (match.group(1), STEPS.index(match.group(2))) if match else None


def _kill(pid: int) -> None:
    try:
        os.killpg(-pid, signal.SIGKILL) if pid < 0 else os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended first
        pass


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    path = tmp_path_factory.mktemp("lake") / "clicks"
    generate_synthetic_parquet(LAKE, str(path))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, lake):
    state_dir = tmp_path_factory.mktemp("daily") / "state"
    done = run_loop(state_dir, lake)
    assert done.returncode == 0, done.stderr[-3000:]
    return state_dir, done


def model_files(state_dir) -> dict[str, bytes]:
    """The files of the export STATE_DIR/current names, by relative path."""
    model = os.path.realpath(os.path.join(state_dir, "current"))
    files = {}
    for folder, _, names in os.walk(model):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                files[os.path.relpath(os.path.join(folder, name), model)] = f.read()
    return files


@pytest.mark.slow
@pytest.mark.loop
def test_the_loop_trains_every_day_but_the_held_back_one_and_promotes(uninterrupted):
    state_dir, done = uninterrupted
    stdout = done.stdout
    state = daily.read_state(str(state_dir / "state.json"))
    assert [r.day for r in state.days] == DAYS[:-1]  # the newest day is held back for the gate
    assert all(r.trained and r.exported and r.promoted for r in state.days)
    # Progressive validation: day k + 1 scored by the model trained through day k.
    records = read_log(str(state_dir / "daily.jsonl"))
    progressive = [r for r in records if r["event"] == "eval"]
    assert [(r["day"], r["trained_through"]) for r in progressive] == list(zip(DAYS[1:], DAYS[:-1]))
    # Logged as one --rolling_windows run: the days' steps counted across them, day k + 1 window k + 1.
    assert [r["step"] for r in records if r["event"] == "train"] == [2, 4, 6, 8, 10, 12]  # logged every 2 steps
    assert [(r["window"], r["step"], r["stage"]) for r in progressive] == [
        (1, 4, "validation"),
        (2, 8, "validation"),
        (3, 12, "validation"),
    ]
    (run,) = report.read_runs(str(state_dir / "daily.jsonl"))
    assert run.window_auroc == [(k + 1, r["auroc"]) for k, r in enumerate(progressive)]
    for r in progressive:
        assert r["num_samples"] == 128 and all(isinstance(r[k], float) for k in ("auroc", "log_loss", "ne"))
        assert isinstance(r["calibration"], float)
    for r, record in zip(progressive, state.days):  # the day's own run log holds the same figures
        (evaluation,) = [
            e for e in read_log(str(state_dir / "days" / record.day / "train.jsonl")) if e["event"] == "eval"
        ]
        assert evaluation["window"] == 1 and evaluation["auroc"] == r["auroc"] == record.progressive["auroc"]
    # The first day is promoted (none in service); each later one by its AUROC on the held-back day.
    gates = [r for r in records if r["event"] == "promote"]
    assert gates[0]["promote"] and gates[0]["reason"] == "no model in service"
    current = state.current
    assert current is not None
    assert os.readlink(state_dir / "current") == os.path.join("days", current, "model")  # relative: moves with it
    in_service = None
    for gate, record in zip(gates, state.days):
        assert gate["auroc_in_service"] == in_service
        if gate["promote"]:
            in_service = gate["auroc"]
        assert gate["in_service"] == max(r.day for r in state.days[: state.days.index(record) + 1] if r.gate["promote"])
    assert f"in service: {current}" in stdout
    # Exports: the first in full (none in service), the others deltas of the in-service
    # model's full export (--full_export_every 7), each measured against its changed rows.
    assert [r.base for r in state.days] == [None, DAYS[0], DAYS[0]]
    exports = [r for r in records if r["event"] == "export"]
    assert [(r["day"], r["base"]) for r in exports] == [(DAYS[1], DAYS[0]), (DAYS[2], DAYS[0])]
    for r in exports:
        assert r == {**r, **daily.delta_size(str(state_dir / "days" / r["day"] / "model"), DAYS[0])}
        assert f"{r['day']}: delta of {DAYS[0]}: {r['bytes']:,} bytes, {r['ratio']:.3f}x" in stdout
    # A rerun has nothing to do and changes nothing.
    before = (state_dir / "state.json").read_bytes()
    again = run_loop(state_dir, state.parquet_path)
    assert again.returncode == 0 and "training" not in again.stdout
    assert (state_dir / "state.json").read_bytes() == before


@pytest.mark.slow
@pytest.mark.loop
def test_each_export_carries_the_seen_ids_of_its_lineage_a_delta_its_own(uninterrupted, tmp_path):
    """Warm starts OR the origin's seen-id filters in: each day's filters hold the
    previous day's. A delta export carries only the bits the new model's filters gained
    since its base's (id_sketch.delta), and serving counts unseen ids against the
    filters they rebuild, not against its base's: byte for byte a full export's."""
    state_dir, _ = uninterrupted
    models = [str(state_dir / "days" / day / "model") for day in DAYS[:-1]]
    sketches = []
    for model in models:
        predictor = Predictor(model, "fp32")
        sketches.append(b"".join(s.packed.tobytes() for s in predictor.layout.sketches))  # type: ignore[attr-defined]
    assert sketches[0] == (state_dir / "days" / DAYS[0] / "model" / SKETCH_FILE).read_bytes()
    for before, after in zip(sketches, sketches[1:]):
        older, newer = np.frombuffer(before, np.uint8), np.frombuffer(after, np.uint8)
        assert len(older) == len(newer) and (older & ~newer).sum() == 0  # every bit kept
        assert (newer & ~older).any()  # and the day's ids added
    assert predictor.base == os.path.normpath(models[0])
    for model, sketch in zip(models[1:], sketches[1:]):
        assert not os.path.exists(os.path.join(model, SKETCH_FILE))
        new, old = np.frombuffer(sketch, np.uint8), np.frombuffer(sketches[0], np.uint8)
        added = int(np.bitwise_count(new & ~old).sum())
        # The bits gained, Golomb-Rice coded: about log2(m / n) + 1.5 bits each (26 filters' codes end in a byte).
        size = os.path.getsize(os.path.join(model, SKETCH_DELTA_FILE))
        assert 0 < size * 8 <= added * (math.log2(8 * len(sketch) / added) + 2) + 26 * 16
        assert size < len(sketch) // 2  # a fraction of the whole filters (64 bits a table row)
    full = str(tmp_path / "full")
    export.export_model(str(state_dir / "days" / DAYS[-2] / "ckpt"), full, [], newest=True)
    with open(os.path.join(full, SKETCH_FILE), "rb") as f:
        assert f.read() == sketches[-1]  # the last delta's filters, rebuilt: the full export's


@pytest.mark.slow
@pytest.mark.loop
def test_killed_at_10_random_points_reruns_to_the_same_bytes(tmp_path, lake, uninterrupted):
    # The killed loop runs in the uninterrupted one's directory (moved aside meanwhile):
    # an export records the paths of its checkpoint and data, which a rerun keeps.
    state_dir, done = uninterrupted
    reference = tmp_path / "reference"
    os.rename(state_dir, reference)
    try:
        _kill_and_rerun(state_dir, lake, reference, done)
    finally:
        os.rename(state_dir, tmp_path / "killed")
        os.rename(reference, state_dir)


def kill_points(reference: Ran, seed: int, count: int = 10) -> list[Kill]:
    """``count`` random points of the uninterrupted run, in its order: each a step it
    announced (every kind at least once) and a time into it, up to the step's length in
    that run (the promote step: its pause)."""
    rng = random.Random(seed)
    starts = [(t, step) for t, line in reference.lines if (step := _step_of(line)) is not None]
    ends = [t for t, _ in starts[1:]] + [reference.seconds]
    lengths = {step: end - t for (t, step), end in zip(starts, ends)}
    steps = [step for _, step in starts]
    chosen = [rng.choice([s for s in steps if s[1] == kind]) for kind in range(len(STEPS))]
    chosen += rng.choices(steps, k=count - len(chosen))
    kills = []
    for step in sorted(chosen, key=steps.index):
        length = PAUSE_S if STEPS[step[1]] == "promoting" else lengths[step]
        kills.append(Kill(step, round(rng.uniform(0.0, length), 2), rng.random() < 0.7))
    return kills


def _kill_and_rerun(state_dir, lake, reference, done: Ran) -> None:
    seed = int(os.environ.get("DAILY_KILL_SEED") or random.SystemRandom().randrange(1 << 16))
    kills = kill_points(done, seed)
    landed = []
    for kill in kills:
        killed = run_loop(state_dir, lake, kill)
        what = f"seed {seed} (DAILY_KILL_SEED), {kill}"
        if killed.returncode == 0:  # the point lay past the loop's end this time
            landed.append(None)
            continue
        assert killed.returncode == -signal.SIGKILL, f"{what}: {killed.stderr[-3000:]}"
        landed.append(kill)
    print(f"kill seed {seed} (DAILY_KILL_SEED): {len([k for k in landed if k])} kills landed: {landed}")
    assert sum(k is not None for k in landed) >= 8, f"seed {seed}: only {landed} killed the loop"
    assert {STEPS[k.step[1]] for k in landed if k is not None} >= {"training", "exporting"}, f"seed {seed}"
    finished = run_loop(state_dir, lake)
    assert finished.returncode == 0, f"seed {seed}: {finished.stderr[-3000:]}"
    assert (state_dir / "state.json").read_bytes() == (reference / "state.json").read_bytes(), f"seed {seed}"
    assert os.readlink(state_dir / "current") == os.readlink(reference / "current")
    # The run log: each step's records once, as the uninterrupted loop's (the killed
    # days' steps ran at another speed).
    assert _figures(state_dir / "daily.jsonl") == _figures(reference / "daily.jsonl"), f"seed {seed}"
    assert model_files(state_dir) == model_files(reference), f"seed {seed}"
    for day in DAYS[:-1]:  # every export, not only the one in service
        comparison = filecmp.dircmp(state_dir / "days" / day / "model", reference / "days" / day / "model")
        assert not (comparison.diff_files or comparison.left_only or comparison.right_only), f"seed {seed}: {day}"


def _figures(log) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("time", "records_per_sec")} for r in read_log(str(log))]


def _done_state(lake, days: list[str], current: str | None) -> daily.DailyState:
    """A state whose ``days`` are done (no step left to run)."""
    gate = {"promote": False, "reason": "test", "auroc": 0.5, "auroc_in_service": None}
    return daily.DailyState(
        parquet_path=str(lake),
        time_column="date",
        entry="dlrm_main.py",
        training_flags=TRAINING,
        schema=daily.Loop(daily.parse(argv("x", lake))[0], TRAINING).schema(DAYS[0]),
        days=[daily.DayRecord(d, trained=True, exported=True, gate=gate, promoted=True) for d in days],
        current=current,
    )


def _write_state(state_dir, state: daily.DailyState, **changes) -> None:
    from common.json_fields import versioned_json

    state_dir.mkdir(parents=True, exist_ok=True)
    document = json.loads(versioned_json(state))
    (state_dir / "state.json").write_text(json.dumps({**document, **changes}))


def test_a_late_day_is_reported_not_trained(tmp_path, lake, capsys):
    state_dir = tmp_path / "state"
    _write_state(state_dir, _done_state(lake, [DAYS[0], DAYS[2]], None))  # 11-02 landed after 11-03 trained
    assert daily.main([*argv(state_dir, lake), *TRAINING]) == 0
    out = capsys.readouterr().out
    assert "late day 2026-11-02: landed after 2026-11-03 was trained; not trained" in out
    state = daily.read_state(str(state_dir / "state.json"))
    assert state.late == ["2026-11-02"] and [r.day for r in state.days] == [DAYS[0], DAYS[2]]
    (late,) = [r for r in read_log(str(state_dir / "daily.jsonl")) if r["event"] == "late_day"]
    assert late["day"] == "2026-11-02" and late["newest_trained"] == "2026-11-03"
    assert not os.path.lexists(state_dir / "current")


def _refused(capsys, args) -> str:
    assert daily.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    return err[0]


def test_a_state_of_a_newer_version_is_refused(tmp_path, lake, capsys):
    state_dir = tmp_path / "state"
    newer = daily.STATE_VERSION + 1
    _write_state(state_dir, _done_state(lake, [], None), version=newer)
    line = _refused(capsys, [*argv(state_dir, lake), *TRAINING])
    assert f"state.json: version is {newer}, newer than this code reads ({daily.STATE_VERSION})" in line
    assert not os.path.lexists(state_dir / "current")


def test_a_state_of_another_lake_or_other_flags_is_refused(tmp_path, lake, capsys):
    state_dir = tmp_path / "state"
    _write_state(state_dir, _done_state(lake, [], None), parquet_path="/elsewhere/lake")
    line = _refused(capsys, [*argv(state_dir, lake), *TRAINING])
    assert f"belongs to another loop: its --parquet_path was /elsewhere/lake, now {lake}" in line
    _write_state(state_dir, _done_state(lake, [], None))
    line = _refused(capsys, [*argv(state_dir, lake), *TRAINING, "--learning_rate", "0.1"])
    assert "belongs to another loop: its the training flags was" in line
    assert not os.path.lexists(state_dir / "current")


def test_a_day_with_a_new_schema_is_refused_before_any_step(tmp_path, lake, capsys):
    changed = tmp_path / "lake"
    for day in DAYS:
        (changed / f"date={day}").mkdir(parents=True)
        table = pq.read_table(str(lake / f"date={day}"))
        if day == DAYS[2]:
            table = table.append_column("C99", pa.array(["x"] * len(table)))
        pq.write_table(table, str(changed / f"date={day}" / "part-0.parquet"))
    state_dir = tmp_path / "state"
    line = _refused(capsys, [*argv(state_dir, changed), *TRAINING])
    assert line.endswith(
        f"{changed}/date=2026-11-03: its schema differs from the first day's (C99: string): "
        "a new schema needs a new model (a new --state_dir)"
    )
    assert not os.path.exists(state_dir / "days") and not os.path.lexists(state_dir / "current")


@pytest.mark.parametrize("given", ["--resume", "--rolling_windows=2", "--warm_start"])
def test_flags_the_loop_sets_are_refused(tmp_path, lake, capsys, given):
    line = _refused(capsys, [*argv(tmp_path / "state", lake), *TRAINING, given])
    assert line.endswith(f"{given.split('=')[0]}: the daily loop sets it for each day's run; leave it out")
    assert not os.path.exists(tmp_path / "state")


def test_a_misspelt_training_flag_is_the_parsers_line_whatever_the_lake(tmp_path, capsys):
    line = _refused(capsys, [*argv(tmp_path / "state", tmp_path / "no_lake"), *TRAINING, "--learning_rat", "0.1"])
    assert line.endswith("error: unrecognized arguments: --learning_rat 0.1")


@pytest.mark.parametrize(
    "passes, auroc, in_service, promote, reason",
    [
        (True, 0.61, None, True, "no model in service"),
        (True, 0.61, 0.60, True, "AUROC 0.6100 on 2026-11-04 vs 0.6000 in service"),
        (True, 0.595, 0.60, True, "AUROC 0.5950 on 2026-11-04 vs 0.6000 in service"),  # within --max_auroc_drop
        (True, 0.58, 0.60, False, "AUROC 0.5800 on 2026-11-04 below the model in service's 0.6000"),
        (False, 0.70, 0.60, False, "its quantized variants failed serving.quality_gate"),
    ],
)
def test_the_gate_promotes_a_candidate_no_worse_than_the_model_in_service(passes, auroc, in_service, promote, reason):
    verdict = daily.gate_verdict(passes, auroc, in_service, 0.01, DAYS[-1])
    assert verdict == {"auroc": auroc, "auroc_in_service": in_service, "promote": promote, "reason": reason}


def test_the_export_is_a_delta_of_the_full_export_in_service_until_it_is_n_days_behind(lake):
    days = [f"2026-11-{d:02d}" for d in range(1, 10)]

    def base(full_every: int, current: str | None, bases: dict[str, str], day: str) -> str | None:
        config, _ = daily.parse([*argv("x", lake), "--full_export_every", str(full_every)])
        state = daily.DailyState(current=current)
        state.days = [daily.DayRecord(d, trained=True, base=bases.get(d)) for d in days]
        return daily.Loop(config, TRAINING).delta_base(state, day)

    assert base(7, None, {}, days[0]) is None  # nothing in service: in full
    assert base(7, days[0], {}, days[1]) == days[0]
    # The delta in service stands on its base: the next delta is of that full export.
    assert base(7, days[2], {days[2]: days[0]}, days[3]) == days[0]
    assert base(3, days[2], {days[2]: days[0]}, days[3]) is None  # 3 days behind: in full
    assert base(1, days[0], {}, days[1]) is None  # --full_export_every 1: every day in full


def test_full_export_every_must_be_at_least_1(tmp_path, lake, capsys):
    line = _refused(capsys, [*argv(tmp_path / "state", lake), "--full_export_every", "0", *TRAINING])
    assert line.endswith("--full_export_every 0: must be at least 1")


def test_a_version_1_state_is_read_its_exports_full(tmp_path, lake):
    state_dir = tmp_path / "state"
    _write_state(state_dir, _done_state(lake, DAYS[:2], DAYS[1]), version=1)
    document = json.loads((state_dir / "state.json").read_text())
    for day in document["days"]:
        del day["base"]  # version 1 had no deltas
    (state_dir / "state.json").write_text(json.dumps(document))
    state = daily.read_state(str(state_dir / "state.json"))
    assert [(r.day, r.base) for r in state.days] == [(DAYS[0], None), (DAYS[1], None)]


def test_warm_start_optimizer_is_the_loops_and_part_of_its_identity(tmp_path, lake, capsys):
    config, rest = daily.parse([*argv("x", lake), "--warm_start_optimizer", *TRAINING])
    assert config.warm_start_optimizer and rest == TRAINING  # passed to every day but the first, with --warm_start
    state_dir = tmp_path / "state"
    _write_state(state_dir, _done_state(lake, [], None))
    line = _refused(capsys, [*argv(state_dir, lake), "--warm_start_optimizer", *TRAINING])
    assert "belongs to another loop: its the training flags was" in line and line.endswith(
        "--warm_start_optimizer (give the same, or a new --state_dir)"
    )


@pytest.mark.slow
@pytest.mark.loop
def test_a_warm_start_from_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path, lake, capsys):
    """The previous day's checkpoint directory holds another model's (another feature
    set): the day's training refuses its warm start, and its line is the loop's."""
    from tests.support.exported_model import tiny_checkpoint

    state_dir = tmp_path / "state"
    _write_state(state_dir, _done_state(lake, [DAYS[0]], None))
    tiny_checkpoint(state_dir / "days" / DAYS[0], "another")  # days/DAY/ckpt: a Criteo model's
    line = _refused(capsys, [*argv(state_dir, lake), *TRAINING])
    assert f"{DAYS[1]}: train refused its input: " in line and "--warm_start" in line, line
    assert "another feature set" in line or "another model" in line, line
    state = daily.read_state(str(state_dir / "state.json"))
    assert [r.day for r in state.days if r.trained] == [DAYS[0]] and state.current is None
    assert not os.path.lexists(state_dir / "current")


@pytest.mark.slow
@pytest.mark.loop
def test_a_delta_on_the_wrong_base_is_refused_in_one_line_nothing_promoted(tmp_path, uninterrupted, capsys):
    """The full export the deltas were taken from is replaced (its manifest rewritten:
    another export to their digest): the gate of the last day, a delta of it, refuses."""
    reference, _ = uninterrupted
    state_dir = tmp_path / "state"
    shutil.copytree(reference, state_dir, symlinks=True)
    state = daily.read_state(str(state_dir / "state.json"))
    last = state.days[-1]
    assert last.base == DAYS[0]
    last.gate, last.promoted = None, False
    _write_state(state_dir, state)
    before = os.readlink(state_dir / "current")
    manifest = state_dir / "days" / DAYS[0] / "model" / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()), indent=3))  # the same files, another digest
    line = _refused(capsys, [*argv(state_dir, state.parquet_path), *TRAINING])
    # The gate's step is named by the day it scores (the held-back one).
    assert f"{DAYS[3]}: gate refused its input: " in line and "is not the export the delta" in line, line
    assert os.readlink(state_dir / "current") == before
    assert daily.read_state(str(state_dir / "state.json")).days[-1].promoted is False
