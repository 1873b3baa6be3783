"""A checkpoint's ``meta.json``: what a run needs besides the tensors to continue, evaluate or export.

Written by `CheckpointMeta.to_json` (the checkpoint manager writes it under a temporary
name, hashes it into the manifest and renames it) and read only by
`CheckpointMeta.from_json`; everything else uses its attributes. The format knows the
model and data sections of the run's config; training reads its optimizers' section
through `meta_section` (training/checkpoint_policy.py, `find_restore_point`). Version 2 stores each
fact once: the model and optimizer flags live in ``config`` (version 1 also kept
copies of them, and the global batch size, at the top level; such files still load).
Version 3 adds the data it was trained on, typed: the source's name (data/sources/)
and its `FeatureDescription`, so an export finds the data's description without the
data; of older files both are derived from the recorded data flags. Version 4 records
the model's interaction sizes in ``config.model.interaction``, the fields of the
interaction's own config (models/interactions/); versions 1 to 3 kept every
interaction's at the top of ``config.model``, and are read into that shape. Version 5
adds ``calibration``: the ``--calibrate`` fit of the validation at the checkpoint's step
(common/calibration.py), which the export applies; null without one. Version 6 adds
``serving_layout`` and ``serving_facts``: the serving input layout of the source
(serving/layouts/) and what it needs of the data besides the features, recorded at
training (`DataSource.serving_facts`: a Parquet table's ids' value types, the label's
name, Criteo's preprocessing), so that export, predict and serve never open the
training data; an older file's export reads the data again. Version 7 adds
``warm_start``: the checkpoint a ``--warm_start`` run started from (`WarmStartOrigin`: its
path, step, run id and meta.json's SHA-256), null for a run started from scratch; older
files read as null.

Example::

    meta = CheckpointMeta(step=120, epoch=0, batch_in_epoch=120, world_size=2,
                          config=dataclasses.asdict(train_config), plan=plan_summary(plan),
                          data_source=source.name, data_features=source.describe(),
                          serving_layout=source.serving_layout, serving_facts=source.serving_facts(dataset))
    assert CheckpointMeta.from_json(meta.to_json(), "meta.json") == meta
"""

from dataclasses import dataclass
from typing import Any

from common.calibration import Calibration
from common.config_flags import Flag, FlagError, config_from_record, flags_of
from common.json_fields import (
    INTEGER,
    OBJECT,
    SHA256,
    TEXT,
    FileFieldError,
    JsonObject,
    Kind,
    integer,
    one_of,
    optional,
    text_list,
    versioned_json,
)
from data.config import DataConfig
from data.sources import SOURCES, FeatureDescription, source_for
from models.config import INTERACTION_TYPES, ModelConfig
from models.interactions import INTERACTIONS

META_VERSION = 7
# The interaction fields of config.model before version 4 (every interaction's, flat).
_FLAT_INTERACTION_FIELDS = (
    "dcn_num_layers",
    "dcn_low_rank_dim",
    "interaction_branch1_layer_sizes",
    "interaction_branch2_layer_sizes",
)
_WHAT = "a checkpoint's meta.json"
_SHARDS = Kind(
    lambda v: (
        isinstance(v, list)
        and all(
            isinstance(s, list) and len(s) == 5 and all(isinstance(i, int) and not isinstance(i, bool) for i in s)
            for s in v
        )
    ),
    "a list of [row, column, rows, columns, rank] shards",
)


@dataclass
class WarmStartOrigin:
    """The checkpoint a ``--warm_start`` run started from, as its checkpoints and run log
    record it: a later run (``--resume``, the daily loop) checks it names the same one.

    Args:
        path: the checkpoint (one step directory) whose weights the run started from.
        step: its step.
        meta_sha256: the SHA-256 of its meta.json (which names its run, step and data).
        run_id: its run's id, when it has one.
    """

    path: str
    step: int
    meta_sha256: str
    run_id: str | None

    def describe(self) -> str:
        return f"{self.path} (step {self.step}, meta.json sha256 {self.meta_sha256[:12]})"

    @classmethod
    def read(cls, record: JsonObject) -> "WarmStartOrigin":
        """Reads what `dataclasses.asdict` wrote; FileFieldError naming the file and field."""
        return cls(
            path=record.get("path", TEXT),
            step=record.get("step", INTEGER),
            meta_sha256=record.get("meta_sha256", SHA256),
            run_id=record.get("run_id", optional(TEXT), None),
        )


@dataclass
class CheckpointMeta:
    """The contents of a checkpoint's meta.json.

    Args:
        step: optimizer steps taken when it was saved.
        epoch: the epoch training continues in (with ``--rolling_windows``: the
            window, one pass each; `next_window`).
        batch_in_epoch: the batch of that epoch training continues at.
        world_size: ranks of the run that saved it.
        config: the run's TrainConfig as ``dataclasses.asdict`` gives it (model,
            optim, data, ... sections; of an older version, read into this one's
            shape); read through the properties below.
        plan: each table's sharding (``sharding_plans.report.plan_summary``).
        data_source: the data source's name (a key of ``data.sources.SOURCES``); read
            through `source_name`. None only in a file older than version 3.
        data_features: the data's features as the source described them when the model
            was built; read through `features`. None only in a file older than version 3.
        run_id: the run log's id.
        early_stopping: the early-stopping state (``EarlyStopping.state_dict``).
        calibration: ``--calibrate``'s fit on the validation at this step, or None.
        serving_layout: the serving input layout of a model trained on the source (a
            key of ``serving.layouts.LAYOUTS``). None in a file older than version 6
            (or one written without a source, as tests do): the export reads the data.
        serving_facts: what that layout reads of the data at export besides the
            features (`DataSource.serving_facts`; the layout reads its fields typed), or
            None as ``serving_layout`` is.
        warm_start: the checkpoint a ``--warm_start`` run started from (kept by its
            resumed runs), or None for a run started from scratch.
        version: the file format.
    """

    step: int
    epoch: int
    batch_in_epoch: int
    world_size: int
    config: dict[str, Any]
    plan: dict[str, dict[str, Any]]
    data_source: str | None
    data_features: FeatureDescription | None
    run_id: str | None = None
    early_stopping: dict[str, Any] | None = None
    calibration: Calibration | None = None
    serving_layout: str | None = None
    serving_facts: dict[str, Any] | None = None
    warm_start: WarmStartOrigin | None = None
    version: int = META_VERSION

    @property
    def model(self) -> ModelConfig:
        """The model the checkpoint holds."""
        return config_from_record(ModelConfig, self.config["model"])  # checked by `from_json`

    @property
    def global_batch_size(self) -> int:
        """Rows per step over all ranks: the unit of its data position."""
        return int(self.config["data"]["batch_size"]) * self.world_size

    @property
    def data(self) -> DataConfig:
        """The data flags it was trained with (those this code knows; `from_json`
        checked them)."""
        return DataConfig.from_flags(**self.flag_values("data", DataConfig, "meta.json"))

    @property
    def rolling_windows(self) -> int | None:
        """The run's --rolling_windows N, if it trained window by window."""
        return self.data.rolling_windows

    @property
    def next_window(self) -> int | None:
        """With --rolling_windows: the window training continues with (the windows
        before it are trained, and each evaluated on the next); None without."""
        return self.epoch if self.rolling_windows is not None else None

    @property
    def source_name(self) -> str:
        """The data source it was trained on (a key of ``data.sources.SOURCES``)."""
        return self.data_source if self.data_source is not None else source_for(self.data).name

    @property
    def data_path(self) -> str | None:
        """What the source's path flag named (None for random data)."""
        return SOURCES[self.source_name](self.data).path

    @property
    def features(self) -> FeatureDescription:
        """The features of the data it was trained on; of a file older than version 3,
        as the source describes them now (a feature spec read again).

        Raises:
            BadInput: the source cannot describe its data (one line naming the file).
        """
        if self.data_features is not None:
            return self.data_features
        return SOURCES[self.source_name](self.data).describe()

    def flag_values(self, section: str, config_class: type[Any], path: str) -> dict[str, Any]:
        """{field: value} of the flags of ``config_class`` that ``config.<section>``
        records with a value, each checked against its flag's type and choices
        (``path``: the file, for the error); a null is left out, as it is the default
        the run had. What ``--mode validate|test`` takes from the checkpoint.

        Raises:
            FileFieldError: one line naming ``path`` and the field.
        """
        recorded = JsonObject(self.config.get(section, {}), path, f"config.{section}")
        values = {}
        for item in flags_of(config_class):
            # A variant's flag (an interaction's) is recorded in its field, where the
            # chosen variant's are.
            holder = recorded if item.within is None else recorded.object(item.within, {})
            if holder.has(item.field.name):
                values[item.field.name] = holder.get(item.field.name, _flag_kind(item))
        return {name: value for name, value in values.items() if value is not None}

    def to_json(self) -> bytes:
        """The file's bytes (version first)."""
        return versioned_json(self)

    @classmethod
    def from_json(cls, data: bytes, path: str) -> "CheckpointMeta":
        """Reads the bytes of ``path`` (version 1 to 7).

        Raises:
            FileFieldError: one line naming ``path`` and the field that is missing,
                malformed or of a newer version.
        """
        document, version = JsonObject.versioned(data, path, _WHAT, META_VERSION)
        config = document.object("config")
        for section in ("model", "optim", "data"):
            config.get(section, OBJECT)
        config.object("data").get("batch_size", integer(1))
        if version < 4:
            config.value["model"] = _nest_interaction(config.value["model"])
        config.value["data"] = _nest_source_options(config.value["data"])
        model = config.object("model")
        model.get("interaction_type", one_of(*INTERACTION_TYPES))
        model.get("interaction", OBJECT)
        meta_section(config.value, "model", ModelConfig, path)
        for table in document.objects("plan").values():
            table.get("sharding_type", TEXT)
            table.get("shards", _SHARDS)
        if version >= 3:
            data_source = document.get("data_source", one_of(*SOURCES))
            data_features = FeatureDescription.read(document.object("data_features"))
        else:  # derived from the data flags when asked
            data_source, data_features = None, None
        meta = cls(
            step=document.get("step", INTEGER),
            epoch=document.get("epoch", INTEGER),
            batch_in_epoch=document.get("batch_in_epoch", INTEGER),
            world_size=document.get("world_size", integer(1)),
            config=config.value,
            plan=document.get("plan", OBJECT),
            run_id=document.get("run_id", optional(TEXT), None),
            early_stopping=document.get("early_stopping", optional(OBJECT), None),
            data_source=data_source,
            data_features=data_features,
            calibration=(
                Calibration.read(document.object("calibration"))
                if document.get("calibration", optional(OBJECT), None) is not None
                else None
            ),
            serving_layout=document.get("serving_layout", optional(TEXT), None),
            serving_facts=document.get("serving_facts", optional(OBJECT), None),
            warm_start=(
                WarmStartOrigin.read(document.object("warm_start"))
                if document.get("warm_start", optional(OBJECT), None) is not None
                else None
            ),
            version=version,
        )
        try:  # the recorded data flags, as `data` and the derived properties read them
            DataConfig.from_flags(**meta.flag_values("data", DataConfig, path))
        except FlagError as e:
            raise FileFieldError(f"{path}: config.data: {e}") from e
        return meta


def meta_section(config: dict[str, Any], section: str, config_class: type[Any], path: str) -> Any:
    """``config_class`` built from a meta.json's ``config.<section>``. The format checks
    the model's section as it reads the file; a section whose class lives above the
    format (training's optimizers) is checked by its reader through this.

    Raises:
        FileFieldError: the section has a field the class does not know, or lacks one
            (one line naming ``path``).
    """
    try:
        return config_from_record(config_class, config[section])
    except TypeError as e:  # a field this code does not know, or one missing
        raise FileFieldError(f"{path}: config.{section} does not describe a {config_class.__name__} ({e})") from e


def _nest_interaction(model: dict[str, Any]) -> dict[str, Any]:
    """A config.model of a version before 4 in version 4's shape: of the flat
    interaction fields, the recorded interaction's go in ``interaction``, the others'
    are dropped (they built nothing). An unknown interaction_type keeps none, for the
    check that follows to name it."""
    kind = model.get("interaction_type")
    own = {item.field.name for item in flags_of(INTERACTIONS[kind].config)} if kind in INTERACTION_TYPES else set()
    nested = {name: value for name, value in model.items() if name not in _FLAT_INTERACTION_FIELDS}
    nested["interaction"] = {name: model[name] for name in _FLAT_INTERACTION_FIELDS if name in own and name in model}
    return nested


def _nest_source_options(data: dict[str, Any]) -> dict[str, Any]:
    """A config.data written before the sources' flags were nested (every source's
    flags at its top) in today's shape: theirs in ``source_options``, where the
    reader looks for them (a file holding both keeps what it has)."""
    if "source_options" in data:
        return data
    own = {item.field.name for item in flags_of(DataConfig) if item.within == "source_options"}
    nested = {name: value for name, value in data.items() if name not in own}
    nested["source_options"] = {name: value for name, value in data.items() if name in own}
    return nested


_VALUE_KINDS = {
    bool: Kind(lambda v: isinstance(v, bool), "true or false"),
    int: Kind(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: Kind(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    str: TEXT,
    list[int]: Kind(
        lambda v: isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v),
        "a list of integers",
    ),
    list[str]: text_list(allow_empty=True),  # a repeated flag (--sequence_columns)
}


def _flag_kind(item: Flag) -> Kind:
    """What a recorded flag value must be: of its type (null where the flag's default
    is) and one of its choices."""
    kind = _VALUE_KINDS[item.value_type]
    if item.default is None:
        kind = optional(kind)
    choices = item.spec.choices
    if choices is None:
        return kind
    return Kind(lambda v: kind.accepts(v) and (v is None or v in choices), f"one of {', '.join(map(str, choices))}")
