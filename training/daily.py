"""The daily loop: every new day of a Parquet lake trained, exported, gated and promoted.

    python -m training.daily --state_dir STATE_DIR --parquet_path LAKE --time_column date [TRAINING FLAGS]

LAKE holds one Hive partition per day (``LAKE/date=2026-11-01/...``). Each run takes
the days in time order. The newest day is held back: it is the data the quality gate
scores candidates on, and it is trained on by the next run (when a newer day has
landed). For every other day not yet trained, the loop:

1. trains on it, warm-started from the previous day's checkpoint (the first day from
   scratch), in a subprocess (``dlrm_main.py``, or ``training.launch`` with
   ``--nproc_per_node N``) whose ``--checkpoint_dir`` is the day's own; the run reads
   the day and the next one (``--rolling_windows 1``), so its one evaluation is the
   progressive validation of the next day: AUROC, log loss, NE and calibration of a
   model that never saw it;
2. exports it (``serving.export``, a subprocess: training does not import serving);
3. gates it on the held-back day: ``serving.quality_gate`` (its quantized variants
   agree with fp32) and its AUROC on that day against the model in service's
   (``serving.predict --metrics_output``), within ``--max_auroc_drop``;
4. promotes it (``STATE_DIR/current``, an atomic symlink to the export, which
   ``serving.serve --model STATE_DIR/current`` follows and reloads), or keeps the model
   in service and logs why.

Every step's completion is recorded in ``STATE_DIR/state.json`` (versioned, written
atomically) after it is done, and each step can be redone: a killed run, rerun, redoes
the step it was in (training with ``--resume`` of the day's checkpoint directory) and
ends with the same models and the same pointer as an uninterrupted run. A day is trained
once; a day that lands after a newer one was trained (late) is reported and skipped.
Bad input (a day whose schema differs from the first day's, a state directory of
another lake or other flags, a state file of a newer version): one line, exit 2,
nothing promoted.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from common.atomic import atomic_symlink, write_bytes
from common.cli import DefaultsHelpFormatter, OneLineParser, run_cli
from common.config_flags import add_flags, config_values, flag
from common.delta_files import DELTA_FILE, DELTA_VERSION, SKETCH_DELTA_FILE
from common.errors import BadInput
from common.json_fields import BOOLEAN, OBJECT, TEXT, JsonObject, Kind, optional, text_list, versioned_json
from common.run_log_file import read_run_log

PROG = "python -m training.daily"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE_FILE = "state.json"
LOG_FILE = "daily.jsonl"
CURRENT = "current"
STATE_VERSION = 2  # 2: a day's export may be a delta (DayRecord.base)
# Flags the loop sets for each day's run: given by the user they would fight it.
_LOOP_FLAGS = (
    "--rolling_windows",
    "--checkpoint_dir",
    "--resume",
    "--warm_start",
    "--log_path",
    "--validation_window",
    "--test_window",
    "--restore_checkpoint_path",
    "--mode",
)
# Test hook: DAILY_PAUSE_S=SECONDS pauses the promote step that long between setting the
# link and recording it, so that a test's random kill can land inside that window too
# (the other steps are subprocesses, seconds long).
PAUSE_ENV = "DAILY_PAUSE_S"
_LIST = Kind(lambda v: isinstance(v, list), "a list")


@dataclass(kw_only=True)
class DailyConfig:
    """The loop's own flags; every other flag goes to the trainer."""

    state_dir: str = flag(help="the loop's directory: state.json, daily.jsonl, days/DAY/ and the current link")
    parquet_path: str = flag(help="the lake: one Hive partition directory per day (LAKE/date=2026-11-01/)")
    time_column: str = flag(help="the partition key of the days (date)")
    entry: str = flag("dlrm_main.py", choices=("dlrm_main.py", "dcnv2_main.py"), help="the training entry point")
    nproc_per_node: int = flag(1, help="ranks of each day's training (more than 1: through training.launch)")
    quantize: str | None = flag(
        None,
        help="serving.export --quantize of each day's export (default: the export's: fp16,int8, or none for a "
        "model with history features)",
    )
    max_auroc_drop: float = flag(
        0.0, help="promote a candidate whose AUROC on the held-back day is at most this below the model in service's"
    )
    warm_start_optimizer: bool = flag(
        False,
        help="each day's warm start carries the previous day's optimizer state too (--warm_start_optimizer of "
        "every day but the first)",
    )
    full_export_every: int = flag(
        7,
        help="export a day in full when the model in service's full export is this many days behind it (or none "
        "serves); other days as a delta of that export (serving.export --delta_from); 1: every day in full",
    )


@dataclass
class DayRecord:
    """What the loop did of one day; each step's field is set once the step is done."""

    day: str
    trained: bool = False
    progressive: dict[str, Any] | None = None  # the next day's figures, from the day's training run
    exported: bool = False
    base: str | None = None  # the day whose full export the day's export is a delta of; None: a full export
    gate: dict[str, Any] | None = None  # {"promote": bool, "reason": str, "auroc": ..., "auroc_in_service": ...}
    promoted: bool = False  # the promote step is done (the link set, or the old model kept)


@dataclass
class DailyState:
    """STATE_DIR/state.json: the lake and flags it belongs to, and the days done."""

    version: int = STATE_VERSION
    parquet_path: str = ""
    time_column: str = ""
    entry: str = ""
    training_flags: list[str] = field(default_factory=list)
    schema: list[str] = field(default_factory=list)  # "name: type" of the first day's columns
    days: list[DayRecord] = field(default_factory=list)
    current: str | None = None  # the day whose export STATE_DIR/current names
    late: list[str] = field(default_factory=list)


def read_state(path: str) -> DailyState:
    """The state file, checked field by field; FileFieldError (one line) when it is
    malformed or written by a newer version."""
    with open(path, "rb") as f:
        document, _ = JsonObject.versioned(f.read(), path, "a daily loop's state", current=STATE_VERSION)
    days = []
    for i, value in enumerate(document.get("days", _LIST)):
        day = JsonObject(value, path, f"days.{i}")
        days.append(
            DayRecord(
                day=day.get("day", TEXT),
                trained=day.get("trained", BOOLEAN),
                progressive=day.get("progressive", optional(OBJECT)),
                exported=day.get("exported", BOOLEAN),
                base=day.get("base", optional(TEXT), None),  # version 1: every export full
                gate=day.get("gate", optional(OBJECT)),
                promoted=day.get("promoted", BOOLEAN),
            )
        )
    return DailyState(
        parquet_path=document.get("parquet_path", TEXT),
        time_column=document.get("time_column", TEXT),
        entry=document.get("entry", TEXT),
        training_flags=document.get("training_flags", text_list(allow_empty=True)),
        schema=document.get("schema", text_list(allow_empty=True)),
        days=days,
        current=document.get("current", optional(TEXT)),
        late=document.get("late", text_list(allow_empty=True)),
    )


class Loop:
    """One run of the loop over the lake's days."""

    def __init__(self, config: DailyConfig, training_flags: list[str]) -> None:
        self.config = config
        self.flags = training_flags
        self.root = os.path.abspath(config.state_dir)
        self.lake = config.parquet_path if "://" in config.parquet_path else os.path.abspath(config.parquet_path)
        self.log_path = os.path.join(self.root, LOG_FILE)
        self._scores: dict[str, dict[str, Any]] = {}

    # -- the lake ---------------------------------------------------------------------
    def lake_days(self) -> list[str]:
        """The days (partition values) of the lake, in time order."""
        if "://" in self.lake:
            raise BadInput(f"--parquet_path {self.lake}: the daily loop reads a local (or mounted) lake")
        if not os.path.isdir(self.lake):
            raise BadInput(f"--parquet_path {self.lake}: no such directory")
        prefix = f"{self.config.time_column}="
        days = sorted(
            name[len(prefix) :]
            for name in os.listdir(self.lake)
            if name.startswith(prefix) and os.path.isdir(os.path.join(self.lake, name))
        )
        if not days:
            raise BadInput(f"--parquet_path {self.lake}: no {prefix}DAY partition directories")
        return days

    def partition(self, day: str) -> str:
        return os.path.join(self.lake, f"{self.config.time_column}={day}")

    def schema(self, day: str) -> list[str]:
        """'name: type' of the day's columns (its first file's), for the new-schema check."""
        import pyarrow.parquet as pq

        for folder, subfolders, names in sorted(os.walk(self.partition(day))):
            subfolders.sort()
            for name in sorted(names):
                if not name.startswith(("_", ".")):
                    schema = pq.read_schema(os.path.join(folder, name))
                    return [f"{f.name}: {f.type}" for f in schema]
        raise BadInput(f"{self.partition(day)}: holds no Parquet file")

    # -- paths ------------------------------------------------------------------------
    def day_dir(self, day: str, *parts: str) -> str:
        return os.path.join(self.root, "days", day, *parts)

    def view(self, day: str, following: str) -> str:
        """A directory of the day's and the next day's partitions (links to the lake's):
        the run trains on window 0 (the day) and evaluates window 1 (the next day)."""
        view = self.day_dir(day, "view")
        os.makedirs(view, exist_ok=True)
        for d in (day, following):
            link = os.path.join(view, f"{self.config.time_column}={d}")
            if not os.path.islink(link):
                os.symlink(self.partition(d), link)
        return view

    # -- the state --------------------------------------------------------------------
    def load_state(self, days: list[str]) -> DailyState:
        path = os.path.join(self.root, STATE_FILE)
        # The state records the days' flags, this one too: a loop cannot change it midway.
        flags = self.flags + (["--warm_start_optimizer"] if self.config.warm_start_optimizer else [])
        if not os.path.exists(path):
            return DailyState(
                parquet_path=self.lake,
                time_column=self.config.time_column,
                entry=self.config.entry,
                training_flags=flags,
                schema=self.schema(days[0]),
            )
        state = read_state(path)
        given = (self.lake, self.config.time_column, self.config.entry, flags)
        recorded = (state.parquet_path, state.time_column, state.entry, state.training_flags)
        if given != recorded:
            names = ("--parquet_path", "--time_column", "--entry", "the training flags")
            what = next(n for n, a, b in zip(names, given, recorded) if a != b)
            raise BadInput(
                f"--state_dir {self.root}: belongs to another loop: its {what} {_shown(recorded, given, what)} "
                "(give the same, or a new --state_dir)"
            )
        return state

    def record(self, record: dict[str, Any]) -> None:
        """One JSON line of the loop's run log (daily.jsonl), flushed as it happens."""
        with open(self.log_path, "a") as f:
            f.write(json.dumps({**record, "time": time.time()}) + "\n")

    def day_records(self, day: str, records: list[dict[str, Any]]) -> None:
        """A step's records of ``day`` in the run log, in place of those a killed run
        wrote of the same step (the log rewritten atomically): a rerun logs each once."""
        events = {r["event"] for r in records}
        kept = []
        if os.path.exists(self.log_path):
            with open(self.log_path) as f:
                kept = [
                    line
                    for line in f.read().splitlines()
                    if line.strip() and not _of_step(json.loads(line), day, events)
                ]
        now = time.time()
        lines = [json.dumps({**r, "loop_day": day, "time": now}) for r in records]
        write_bytes(self.log_path, "".join(line + "\n" for line in kept + lines).encode())

    def save(self, state: DailyState) -> None:
        write_bytes(os.path.join(self.root, STATE_FILE), versioned_json(state))

    # -- the run ----------------------------------------------------------------------
    def run(self) -> int:
        days = self.lake_days()
        state = self.load_state(days)
        for day in days:  # a partition with a new schema: refused before any step
            if self.schema(day) != state.schema:
                changed = sorted(set(self.schema(day)) ^ set(state.schema))
                raise BadInput(
                    f"{self.partition(day)}: its schema differs from the first day's ({', '.join(changed[:4])}): "
                    "a new schema needs a new model (a new --state_dir)"
                )
        check_training_flags(self.config, self.flags, days)  # SystemExit(2) with the trainer's line
        os.makedirs(self.root, exist_ok=True)
        self.save(state)
        held = days[-1]
        done = {record.day: record for record in state.days}
        newest_trained = max((r.day for r in state.days if r.trained), default=None)
        late = [d for d in days[:-1] if d not in done and newest_trained is not None and d < newest_trained]
        for day in late:
            if day not in state.late:
                state.late.append(day)
            print(f"late day {day}: landed after {newest_trained} was trained; not trained (a day trains in order)")
            self.record({"event": "late_day", "run_id": "daily", "day": day, "newest_trained": newest_trained})
        self.save(state)
        todo = [d for d in days[:-1] if d not in late]
        print(f"days: {len(days)} in the lake, {held} held back for the gate, {len(todo)} to train or finish")
        for day in todo:
            record = done.get(day)
            if record is None:
                record = DayRecord(day)
                state.days.append(record)
                done[day] = record
            previous = next((r.day for r in reversed(state.days[: state.days.index(record)]) if r.trained), None)
            self.day(state, record, previous, days[days.index(day) + 1], held)
        print(f"in service: {state.current or 'none'}")
        return 0

    def day(self, state: DailyState, record: DayRecord, previous: str | None, following: str, held: str) -> None:
        day = record.day
        if not record.trained:
            record.progressive = self.train(day, previous, following)
            record.trained = True
            self.log_day(state, record, following)  # before the step is recorded done: a rerun logs it again
            self.save(state)
        model = self.day_dir(day, "model")
        if not record.exported:
            base = self.delta_base(state, day)  # the same on a rerun: it reads what earlier days recorded
            why = self.no_delta(day, base) if base is not None else None
            if why is not None:  # a delta keeps every table's shape and the base's vocabulary
                print(f"{day}: exporting in full, not as a delta of {base}: {why}", flush=True)
                self.day_records(
                    day, [{"event": "full_export", "run_id": "daily", "day": day, "base": base, "reason": why}]
                )
                base = None
            if not os.path.isdir(model):  # serving.export renames a complete export into place, or none
                self.export(day, model, base)
            if base is not None:
                self.day_records(day, [{"event": "export", "run_id": "daily", "day": day, **delta_size(model, base)}])
            record.base = base
            record.exported = True
            self.save(state)
        if record.gate is None:
            print(f"{day}: gating on {held}", flush=True)
            record.gate = self.gate(model, state.current, held)
            self.day_records(day, [{"event": "gate", "run_id": "daily", "day": day, "held_back": held, **record.gate}])
            self.save(state)
        if not record.promoted:
            print(f"{day}: promoting", flush=True)
            if record.gate["promote"]:
                atomic_symlink(os.path.join(self.root, CURRENT), model)
                time.sleep(float(os.environ.get(PAUSE_ENV) or 0))
                state.current = day
            record.promoted = True
            promote = {"event": "promote", "run_id": "daily", "day": day, "in_service": state.current, **record.gate}
            self.day_records(day, [promote])
            self.save(state)
            verdict = "promoted" if record.gate["promote"] else f"kept {state.current or 'none'}"
            print(f"{day}: {verdict} ({record.gate['reason']})")

    def log_day(self, state: DailyState, record: DayRecord, following: str) -> None:
        """The day's training steps and its progressive validation in the loop's run
        log, as the trainer logs a --rolling_windows run (one run, ``run_id`` daily,
        its steps counted across the days, window k the k-th day scored), so that
        ``python -m training.report STATE_DIR/daily.jsonl`` draws the loop."""
        assert record.progressive is not None
        chain = [r for r in state.days if r.trained]
        window = chain.index(record) + 1
        offset = sum(int((r.progressive or {}).get("step") or 0) for r in chain[: window - 1])
        steps: dict[int, dict[str, Any]] = {}  # a resumed day's log repeats steps: the last one counts
        for r in read_run_log(self.day_dir(record.day, "train.jsonl")):
            if r.event == "train" and isinstance(r.get("step"), int):
                steps[r["step"]] = r
        records = [
            {
                "event": "train",
                "run_id": "daily",
                "day": record.day,
                "step": offset + step,
                **{k: steps[step].get(k) for k in ("loss", "lr", "records_per_sec")},
            }
            for step in sorted(steps)
        ]
        figures = {k: v for k, v in record.progressive.items() if k != "step"}
        step = offset + int(record.progressive.get("step") or 0)
        records.append(
            {
                "event": "eval",
                "stage": "validation",
                "run_id": "daily",
                "window": window,
                "step": step,
                "day": following,
                "trained_through": record.day,
                **figures,
            }
        )
        self.day_records(record.day, records)

    def train(self, day: str, previous: str | None, following: str) -> dict[str, Any]:
        """Trains the day (resuming its own checkpoint directory when a killed run left
        one); its evaluation of the next day is the progressive validation."""
        ckpt = self.day_dir(day, "ckpt")
        log = self.day_dir(day, "train.jsonl")
        argv = [
            *self.flags,
            "--parquet_path",
            self.view(day, following),
            "--time_column",
            self.config.time_column,
            "--rolling_windows",
            "1",
            "--checkpoint_dir",
            ckpt,
            "--resume",
            "--log_path",
            log,
        ]
        if previous is not None:
            argv += ["--warm_start", self.day_dir(previous, "ckpt")]
            argv += ["--warm_start_optimizer"] if self.config.warm_start_optimizer else []
        entry = os.path.join(REPO, self.config.entry)
        if self.config.nproc_per_node > 1:
            command = ["-m", "training.launch", "--standalone", "--nproc_per_node", str(self.config.nproc_per_node)]
            command += [entry, *argv]
        else:
            command = [entry, *argv]
        print(f"{day}: training" + (f", warm-started from {previous}" if previous else ", from scratch"), flush=True)
        self.subprocess(command, "train", day)
        evaluations = [r for r in read_run_log(log) if r.event == "eval" and r.get("window") == 1]
        if not evaluations:
            raise BadInput(f"{log}: the day's run logged no evaluation of {following}")
        last = evaluations[-1]
        return {k: last.get(k) for k in ("auroc", "log_loss", "ne", "calibration", "num_samples", "step")}

    def delta_base(self, state: DailyState, day: str) -> str | None:
        """The day whose full export ``day``'s export is a delta of: the model in
        service's full export (itself, or the base of the delta in service), unless it
        is ``--full_export_every`` days behind or none serves (None: a full export)."""
        if state.current is None:
            return None
        records = {r.day: r for r in state.days}
        full = records[state.current].base or state.current
        chain = [r.day for r in state.days if r.trained]
        if chain.index(day) - chain.index(full) >= self.config.full_export_every:
            return None
        return full

    def no_delta(self, day: str, base: str) -> str | None:
        """Why the day's export cannot be a delta of ``base``'s (None when it can): its
        tables grew (a warm start's grown vocabulary, or larger table flags), its id
        vocabulary is another, or it maps ids by zch; read from both days' newest
        checkpoints, which their exports take."""
        from checkpoints.directory import newest_checkpoint
        from checkpoints.opened import read_meta

        metas = []
        for d in (base, day):
            path = newest_checkpoint(self.day_dir(d, "ckpt"))
            if path is None:
                raise BadInput(f"{self.day_dir(d, 'ckpt')}: holds no complete checkpoint to export")
            metas.append(read_meta(path))
        hashing = ((metas[1].config.get("data") or {}).get("source_options") or {}).get("id_hashing")
        if hashing == "zch":  # its id-to-row map (buffers, not weights) moves every day
            return "a zch model's id-to-row mapping changes with the day's ids, and a delta carries weights only"
        was, now = (m.model.num_embeddings_per_feature for m in metas)
        if list(was) != list(now):
            grown = [f"{t} {a} -> {b}" for t, a, b in zip(metas[1].model.table_names, was, now) if a != b]
            return f"its tables changed ({', '.join(grown[:3])}{', ...' if len(grown) > 3 else ''} rows)"
        vocabularies = [((m.serving_facts or {}).get("id_vocabulary") or {}).get("sha256") for m in metas]
        if vocabularies[0] != vocabularies[1]:
            return "its id vocabulary changed"
        return None

    def export(self, day: str, model: str, base: str | None) -> None:
        print(f"{day}: exporting" + (f" a delta of {base}" if base else " in full"), flush=True)
        for name in os.listdir(os.path.dirname(model)):  # the staging directory of a killed export
            if name.startswith(f".{os.path.basename(model)}.tmp"):
                shutil.rmtree(os.path.join(os.path.dirname(model), name))
        quantize = [] if self.config.quantize is None else ["--quantize", self.config.quantize]
        command = ["-m", "serving.export", "--checkpoint", self.day_dir(day, "ckpt"), "--newest", "--output", model]
        if base is not None:
            command += ["--delta_from", self.day_dir(base, "model")]
        self.subprocess([*command, *quantize], "export", day)
        if base is not None:
            size = delta_size(model, base)
            print(
                f"{day}: delta of {base}: {size['bytes']:,} bytes, {size['ratio']:.3f}x the {size['changed_bytes']:,} "
                f"bytes of its changed rows and dense part ({size['sketch_bytes']:,} of its bytes are seen-id filter "
                f"changes; without them {size['ratio_without_sketch']:.3f}x)"
            )

    def gate(self, model: str, current: str | None, held: str) -> dict[str, Any]:
        """The quality gate on the held-back day and the comparison with the model in
        service there: {"promote", "reason", "auroc", "auroc_in_service"}."""
        data = self.partition(held)
        gate = self.subprocess(
            ["-m", "serving.quality_gate", "--model", model, "--data", data], "gate", held, ok=(0, 1)
        )
        candidate = self.score(model, held)
        in_service = self.score(self.day_dir(current, "model"), held).get("auroc") if current else None
        return gate_verdict(gate == 0, candidate.get("auroc"), in_service, self.config.max_auroc_drop, held)

    def score(self, model: str, day: str) -> dict[str, Any]:
        """serving.predict's figures of ``model`` on the day (cached for this run)."""
        key = f"{os.path.realpath(model)}@{day}"
        if key not in self._scores:
            out = os.path.join(os.path.dirname(model), "scores", f"{day}.json")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            command = ["-m", "serving.predict", "--model", model, "--input", self.partition(day)]
            self.subprocess([*command, "--output", out + ".parquet", "--metrics_output", out], "score", day)
            with open(out) as f:
                self._scores[key] = json.load(f)
        return self._scores[key]

    def subprocess(self, args: list[str], step: str, day: str, ok: Sequence[int] = (0,)) -> int:
        """Runs ``python ARGS`` from the repository; its bad input is the loop's (exit 2).
        The child dies with the loop (a loop killed alone leaves no step running that
        its rerun would race)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
        sys.stdout.flush()  # the loop's lines before the child's
        child = subprocess.Popen([*_dying_with_this_process(), *args], cwd=REPO, env=env, stderr=subprocess.PIPE)
        # The child's stderr passes through a line late: its last line, a refusal's, becomes the loop's.
        last = None
        assert child.stderr is not None
        for line in child.stderr:
            if last is not None:
                sys.stderr.write(last.decode(errors="replace"))
                sys.stderr.flush()
            last = line
        code = child.wait()
        if code == 2 and last is not None and last.strip():
            raise BadInput(f"{day}: {step} refused its input: {last.decode(errors='replace').strip()}")
        if last is not None:
            sys.stderr.write(last.decode(errors="replace"))
            sys.stderr.flush()
        if code == 2:
            raise BadInput(f"{day}: {step} refused its input (exit 2)")
        if code not in ok:
            raise RuntimeError(f"{day}: {step} failed (exit {code})")
        return code


def delta_size(model: str, base: str) -> dict[str, Any]:
    """What a delta export holds against what it must: ``bytes``, all its files';
    ``changed_bytes``, the bytes of the rows that changed since its base, of every table
    and dense weight of every program (delta.json's regions); ``ratio``, the first over
    the second. ``sketch_bytes``: the part of ``bytes`` that is the seen-id filters (the
    bits they gained, id_sketch.delta, or whole when they are not the base's grown);
    ``ratio_without_sketch``: the ratio without them."""
    from data.parquet.id_sketch import SKETCH_FILE

    path = os.path.join(model, DELTA_FILE)
    with open(path, "rb") as f:  # serving/delta.py's DeltaRecord (training does not import serving)
        document, _ = JsonObject.versioned(f.read(), path, "an exported model's delta record", current=DELTA_VERSION)
    regions = document.get("regions", OBJECT)
    changed = sum(int(r["changed"]) * int(r["row_bytes"]) for variant in regions.values() for r in variant)
    sizes = {name: os.path.getsize(os.path.join(model, name)) for name in os.listdir(model)}
    sketch = sum(size for name, size in sizes.items() if name in (SKETCH_FILE, SKETCH_DELTA_FILE))
    total = sum(sizes.values())
    return {
        "base": base,
        "bytes": total,
        "changed_bytes": changed,
        "ratio": round(total / max(changed, 1), 4),
        "sketch_bytes": sketch,
        "ratio_without_sketch": round((total - sketch) / max(changed, 1), 4),
    }


def gate_verdict(
    variants_pass: bool, auroc: float | None, in_service: float | None, max_auroc_drop: float, held: str
) -> dict[str, Any]:
    """Whether a candidate is promoted, and why: its quantized variants pass
    serving.quality_gate, and its AUROC on the held-back day is at least the model in
    service's less ``max_auroc_drop`` (any candidate when none is in service)."""
    result: dict[str, Any] = {"auroc": auroc, "auroc_in_service": in_service}
    if not variants_pass:
        return {**result, "promote": False, "reason": "its quantized variants failed serving.quality_gate"}
    if in_service is None:
        return {**result, "promote": True, "reason": "no model in service"}
    if auroc is None or auroc < in_service - max_auroc_drop:
        reason = f"AUROC {_fmt(auroc)} on {held} below the model in service's {_fmt(in_service)}"
        return {**result, "promote": False, "reason": reason}
    return {**result, "promote": True, "reason": f"AUROC {_fmt(auroc)} on {held} vs {_fmt(in_service)} in service"}


def _of_step(record: Any, day: str, events: set[str]) -> bool:
    return isinstance(record, dict) and record.get("loop_day") == day and record.get("event") in events


# Run by the child's interpreter before it becomes the step (exec keeps the setting):
# Linux sends it SIGKILL when its parent, the loop, dies (prctl PR_SET_PDEATHSIG); a
# loop that died before the call is no longer its parent. (Not a preexec_fn: a fork of
# a process with threads, pyarrow's, may only exec.)
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(137)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _dying_with_this_process() -> list[str]:
    """The start of the command line of a Python child that dies with this process (on
    Linux; elsewhere a plain child)."""
    if not sys.platform.startswith("linux"):
        return [sys.executable]
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), sys.executable]


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _shown(recorded: tuple[Any, ...], given: tuple[Any, ...], what: str) -> str:
    names = ("--parquet_path", "--time_column", "--entry", "the training flags")
    i = names.index(what)
    return f"was {_words(recorded[i])}, now {_words(given[i])}"


def _words(value: Any) -> str:
    return " ".join(value) if isinstance(value, list) else str(value)


def parse(argv: Sequence[str] | None) -> tuple[DailyConfig, list[str]]:
    parser = OneLineParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog="Every other flag is a training flag, passed to each day's run (python dlrm_main.py --help "
        "lists them); docs/daily.md describes the loop.",
        formatter_class=DefaultsHelpFormatter,
    )
    add_flags(parser, DailyConfig, parser_defaults=True)
    args, rest = parser.parse_known_args(argv)
    config = DailyConfig(**config_values(DailyConfig, args))
    for item in rest:
        name = item.split("=", 1)[0]
        if name in _LOOP_FLAGS:
            raise BadInput(f"{name}: the daily loop sets it for each day's run; leave it out")
    if config.full_export_every < 1:
        raise BadInput(f"--full_export_every {config.full_export_every}: must be at least 1")
    if config.nproc_per_node < 1:
        raise BadInput(f"--nproc_per_node {config.nproc_per_node}: must be at least 1")
    if re.search(r"[/=]", config.time_column):
        raise BadInput(f"--time_column {config.time_column}: a partition key, such as date")
    return config, rest


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    return run_cli(lambda: _main(argv), PROG)


def _main(argv: Sequence[str] | None) -> int:
    config, rest = parse(argv)
    try:
        check_flag_names(config, rest)
        return Loop(config, rest).run()
    except SystemExit as e:  # the trainer's parser said why (check_training_flags), in one line
        return int(e.code or 0)


def check_flag_names(config: DailyConfig, training_flags: list[str]) -> None:
    """The day's runs' flags read by the entry point's parser alone, before the lake is
    listed: an unknown or misspelt flag is the parser's one line, whatever the lake holds."""
    from training.flags import build_parser
    from training.recipes import DCNV2

    recipe = DCNV2 if config.entry == "dcnv2_main.py" else None
    lake = ["--parquet_path", config.parquet_path, "--time_column", config.time_column]
    build_parser(PROG, "", recipe).parse_args([*training_flags, *lake])


def check_training_flags(config: DailyConfig, training_flags: list[str], days: list[str]) -> None:
    """The day's runs' flags parsed as the entry point parses them, on a view of the
    lake's first two days (as a day's run reads two), before anything is written: a bad
    one is the trainer's one line, exit 2. (Not the whole lake: a vocabulary or table
    profile the check builds would read it all.) The check's own lines are not shown."""
    import contextlib
    import io
    import tempfile

    from training.flags import parse_config
    from training.recipes import DCNV2

    recipe = DCNV2 if config.entry == "dcnv2_main.py" else None
    lake = os.path.abspath(config.parquet_path)
    with tempfile.TemporaryDirectory(prefix="daily-check-") as view:
        for day in days[:2]:
            name = f"{config.time_column}={day}"
            os.symlink(os.path.join(lake, name), os.path.join(view, name))
        data = ["--parquet_path", view if len(days) > 1 else lake, "--time_column", config.time_column]
        data += ["--rolling_windows", "1"]
        ckpt = ["--checkpoint_dir", os.path.join(os.path.abspath(config.state_dir), "days"), "--resume"]  # as a day's
        with contextlib.redirect_stdout(io.StringIO()):
            parse_config([*training_flags, *data, *ckpt], PROG, "", recipe)


if __name__ == "__main__":
    sys.exit(main())
