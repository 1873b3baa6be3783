"""Exports a (sharded) training checkpoint as single-host inference models.

    python -m serving.export --checkpoint CKPT --output MODEL_DIR [--quantize fp16,int8]

CKPT is one checkpoint (``.../step_000000100``) or a ``--checkpoint_dir``: the checkpoint
its best.json marks (the best validation's model), else (or with ``--newest``) its newest
complete one. It is loaded in this one process, whatever the world size and
sharding plan it was saved with. MODEL_DIR receives:

    fp32.pt2       torch.export program, dynamic batch dimension, every table looked up
                   by one embedding_bag over their concatenation (a graph of the same
                   size for any number of features)
    fp16.pt2       torch.export program, fp16 embedding tables (torchrec inference
                   quantization, looked up by FBGEMM's inference operators)
    int8.pt2       torch.export program, int8 row-wise quantized embedding tables
    inputs.json    feature names, hotness and table sizes, the input layout of the
                   predictor (raw Criteo lines, BYO CSV rows for a model trained
                   with --dataset_path, Parquet rows or JSON objects for a model
                   trained with --parquet_path) and its transforms (for Parquet: the
                   columns, dense transform and id hashing), each variant's file and
                   size (serving/model_inputs.py; each layout: serving/layouts/)
    vocabulary.npz the preprocessing's vocabulary, when the data was made with a
                   frequency threshold
    manifest.json  written last: every file's size and SHA-256 (serving/model_files.py)

With ``--format aoti`` (the default, ``program``, writes the above) it also gets:

    fp32.aoti.pt2  AOTInductor package of the fp32 program (compiled native code, dynamic
                   batch); fp16.aoti.pt2 and int8.aoti.pt2 of the quantized models (their
                   torch.export programs, FBGEMM's inference operators included). Loaded
                   by the predictor, the gate and the endpoint only with --trust_native_code
    triton/        a model repository for Triton's PyTorch backend, one model a package
                   (serving/triton_repository.py; untested here)

Every variant maps (dense (B, num_dense) float32 transformed, (B, 0) for data of
categorical features only; sparse (B, sum of hotness) int64 ids: (B, 26) for Criteo)
to click probabilities (B,). A model trained on Parquet takes bags of any length up
to its hotness: one place for a single-valued column, ``--max_bag_size`` places for a
list column, the places a bag leaves empty holding -1 (`PADDING_ID`); an empty bag
adds nothing, as in training. The directory is written under a temporary name and renamed
when complete. Bad input: one line on stderr, exit 2.

A model with history features (``--sequence_columns``) also takes ``history_values``
(N,) int64, every history id of the batch row by row and within a row history by
history, and ``history_lengths`` (B, S) int64 (serving/inference_model.py); inputs.json lists the
histories. Its programs are fp32 only: ``--quantize`` other than none is refused.

With ``--delta_from MODEL`` (a full export of the same model) MODEL_DIR becomes a delta
export instead: ``fp32.delta`` (and the quantized variants') holding only the table rows
changed since MODEL and the dense part, ``delta.json`` naming MODEL by its manifest's
digest, inputs.json and manifest.json; predict and serve apply it onto MODEL
(serving/delta.py). ``--format program`` only.

The training data is not read: the checkpoint's meta.json records what its layout
needs of it (version 6). A checkpoint saved before that is described from its data,
read again (``--training_data``: where it is now).
"""

import argparse
import contextlib
import copy
import errno
import hashlib
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
from torch.fx.experimental.symbolic_shapes import free_symbols
from torchrec.inference.modules import quantize_inference_model

from checkpoints.directory import checkpoint_to_load
from checkpoints.meta import CheckpointMeta
from checkpoints.opened import OpenedCheckpoint, open_checkpoint
from common.atomic import atomic_dir, naming_write_errors, surfacing_write_errors
from common.byte_sizes import format_bytes
from common.cli import positive_int, run_cli
from common.config_flags import flag
from common.errors import BadInput
from common.library_noise import EAGER_QUANTIZATION_NOTICES, INDUCTOR_NOTICES, quiet_benign_library_messages, quieted
from common.path_lock import LockHeld, PathLock
from data.parquet.id_sketch import SKETCH_FILE, IdSketch, sketches_to_bytes
from data.parquet.id_vocabulary import VOCABULARY_FILE as ID_VOCABULARY_FILE
from data.parquet.id_vocabulary import IdVocabulary, VocabularyError
from data.parquet.zch_map import ZCH_MAP_FILE, ZchIdMap
from data.preprocess.criteo_transforms import VOCABULARY_FILE
from data.sources import SOURCES
from models.config import ModelConfig
from serving.cli import parse_config, serving_parser
from serving.delta import (
    DELTA_FILE,
    SKETCH_DELTA_FILE,
    Base,
    DeltaRecord,
    check_applies,
    delta_file,
    diff_programs,
    diff_sketches,
    different_inputs,
    program_tensors,
    saved_graph,
)
from serving.inference_model import ProbabilityModel, SequenceProbabilityModel, load_checkpoint_model
from serving.layouts import LAYOUTS
from serving.layouts.base import TRAINING_DATA_FLAG, Checkpoint
from serving.layouts.criteo_lines import CriteoPreprocessing
from serving.model_files import (
    AOTI_FORMAT,
    DELTA_FORMAT,
    MANIFEST_FILE,
    TORCH_EXPORT_FORMAT,
    aoti_metadata,
    read_file,
    write_manifest,
)
from serving.model_inputs import (
    HISTORY_INPUTS,
    INPUTS_FILE,
    HistoryInput,
    ModelInputs,
    Variant,
    aoti_file,
    aoti_variant,
    program_file,
)
from serving.triton_repository import write_triton_model

FP32_FILE = program_file("fp32")
# Places of a Parquet list column's bag in the exported model's input, by default.
DEFAULT_MAX_BAG_SIZE = 64
QUANTIZED_DTYPES = {"fp16": torch.float16, "int8": torch.int8}
# --format: the code-free files alone, or AOTInductor packages and a Triton repository beside them.
PROGRAM_FORMAT = "program"
EXPORT_FORMATS = (PROGRAM_FORMAT, AOTI_FORMAT)


class ExportError(BadInput):
    """The export cannot be written: --output unusable, taken by another export, or
    the disk full (the partial export is removed)."""


@contextlib.contextmanager
def _model_file(path: str) -> Iterator[BinaryIO]:
    """A file object for torch's writers at ``path``: a full disk raises its OSError,
    instead of torch's "unexpected pos" or an abort of the process."""
    with open(path, "wb") as f, surfacing_write_errors(f) as out:
        yield out


def export_program(model: ProbabilityModel, example: Sequence[torch.Tensor]) -> torch.export.ExportedProgram:
    """torch.export with a dynamic batch dimension (non-strict: TorchRec's KJT is Python);
    a model with history features also takes any number of history ids."""
    batch = torch.export.Dim("batch", min=1, max=1 << 24)
    dynamic: dict[str, Any] = {"dense": {0: batch}, "sparse": {0: batch}}
    if isinstance(model, SequenceProbabilityModel):
        values, lengths = HISTORY_INPUTS
        dynamic.update({values: {0: torch.export.Dim("history_ids", min=0, max=1 << 40)}, lengths: {0: batch}})
    return torch.export.export(model.eval(), tuple(example), dynamic_shapes=dynamic, strict=False)


def example_inputs(inputs: ModelInputs) -> tuple[torch.Tensor, ...]:
    """What the export traces the model with: 4 rows of zeros; of a model with
    history features also 2 ids a history (sizes above 1: torch.export would fix a
    size of 0 or 1 in the program)."""
    batch = 4
    dense = torch.zeros(batch, inputs.num_dense_features)
    sparse = torch.zeros(batch, sum(inputs.sparse_hotness), dtype=torch.int64)
    if not inputs.histories:
        return dense, sparse
    lengths = torch.full((batch, len(inputs.histories)), 2, dtype=torch.int64)
    return dense, sparse, torch.zeros(int(lengths.sum()), dtype=torch.int64), lengths


def fp32_program(model: ProbabilityModel, example: Sequence[torch.Tensor]) -> torch.export.ExportedProgram:
    """The fp32 program, every table looked up at once (`ConcatenatedTables`, a copy of
    the tables while it runs): its graph has as many nodes for 500 features as for 26,
    where TorchRec's collection emits a chain per feature (21,561 nodes at 200
    features, a program torch.export.load did not load in 600 s). A model with history
    features is made with its concatenated tables already (`SequenceProbabilityModel`)."""
    if isinstance(model, SequenceProbabilityModel):
        return export_program(model, example)
    batched = ProbabilityModel(
        model.dlrm,
        model.sparse_feature_names,
        model.hotness,
        concatenated_tables=True,
        padded=model.padded,
        calibration=model.calibration,
    )
    return export_program(batched, example)


def save_program(program: torch.export.ExportedProgram, path: str) -> None:
    with _model_file(path) as f:
        torch.export.save(program, f)


def quantized_model(model: ProbabilityModel, dtype: torch.dtype) -> ProbabilityModel:
    """``model`` with every table quantized to ``dtype`` (torchrec's inference
    quantization: FBGEMM's kernel looks them up); ``model`` is left as it is."""
    table_names = list(model.dlrm.sparse_arch.embedding_bag_collection.embedding_bags.keys())
    with quieted(EAGER_QUANTIZATION_NOTICES):
        quantized = quantize_inference_model(
            copy.deepcopy(model.dlrm), per_table_weight_dtype={t: dtype for t in table_names}
        )
    return ProbabilityModel(
        quantized, model.sparse_feature_names, model.hotness, padded=model.padded, calibration=model.calibration
    ).eval()


class _NoCacheLocations:
    """Stands in for the TensorQueue of cache locations of an FBGEMM inference kernel
    without a cache: its forward pops the queue, which, never pushed to, gives back
    the tensor it was made with."""

    def __init__(self, empty: torch.Tensor) -> None:
        self.empty = empty

    def pop(self) -> torch.Tensor:
        return self.empty


def quantized_program(
    model: ProbabilityModel, dtype: torch.dtype, example: Sequence[torch.Tensor]
) -> torch.export.ExportedProgram:
    """torch.export of ``model`` with its tables quantized to ``dtype``; the graph
    calls FBGEMM's inference operators (bounds check, lookup), and reads each
    feature's bag count as a data-dependent size (u0...).

    torch.export traces every TorchScript object a module holds and has no fake class
    for FBGEMM's: the kernel's two AtomicCounters serve only prefetching into a UVM
    cache (removed) and its TensorQueue of cache locations gives an empty tensor on
    every forward (replaced by `_NoCacheLocations`); CPU kernels have no cache.
    """
    quantized = quantized_model(model, dtype)
    # torchrec's quantized collection caches its feature order on its first call, through a
    # torch.tensor(data=...) that torch.export cannot trace: one eager call first.
    quantized(*example)
    # Its per-table weights are views of the kernel's, kept for its state_dict (forward reads
    # the kernel's): torch.export.save would write every table twice.
    quantized.dlrm.sparse_arch.embedding_bag_collection.embedding_bags = torch.nn.ModuleDict()
    for kernel in quantized.modules():
        if isinstance(kernel, IntNBitTableBatchedEmbeddingBagsCodegen):
            if kernel.lxu_cache_weights.numel():
                raise ValueError("a quantized kernel with a cache cannot be exported (CPU kernels have none)")
            del kernel.timestep_counter, kernel.timestep_prefetch_size
            kernel.lxu_cache_locations_list = _NoCacheLocations(kernel.lxu_cache_locations_list.pop())
    with quieted(EAGER_QUANTIZATION_NOTICES):  # torchrec 1.6.1's quantized lookup, traced
        return _without_unused_symbols(export_program(quantized, example))


def _without_unused_symbols(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` without the ranges of data-dependent sizes (u3...) that no graph
    value has any more: KJT's offsets, read with .item() while tracing and then left
    unused, keep theirs, and torch.export.load warns "Symbol uN did not appear in the
    graph" for each."""
    used = set()
    for node in program.graph.nodes:
        used |= free_symbols(node.meta.get("val"))
    for symbol in [s for s in program.range_constraints if s not in used]:
        del program.range_constraints[symbol]  # the property gives the program's own dict
    return program


def compile_aoti(program: torch.export.ExportedProgram, path: str) -> None:
    """Compiles ``program`` with AOTInductor into the package ``path`` (a ``.pt2``)."""
    with quieted(INDUCTOR_NOTICES):
        import torch._inductor  # here: slow to import, and only --format aoti needs it

        # The input columns go into the package's metadata: loaders check them against
        # inputs.json before its compiled code runs (serving/model_files.py).
        torch._inductor.aoti_compile_and_package(
            program, package_path=path, inductor_configs={"aot_inductor.metadata": aoti_metadata(program)}
        )


def _check_compiler() -> None:
    """--format aoti compiles C++: refused up front without the compiler inductor uses."""
    with quieted(INDUCTOR_NOTICES):
        from torch._inductor.cpp_builder import get_cpp_compiler
    try:
        get_cpp_compiler()
    except Exception as e:  # inductor raises its own types when no compiler is found
        raise ExportError(
            f"--format {AOTI_FORMAT} compiles C++, and no C++ compiler was found "
            f"({type(e).__name__}): install g++ (Debian: apt-get install g++)"
        ) from e


def describe_inputs(
    model_config: ModelConfig,
    meta: CheckpointMeta,
    checkpoint: str,
    max_bag_size: int = DEFAULT_MAX_BAG_SIZE,
    training_data: str | None = None,
) -> ModelInputs:
    """inputs.json without the variants: what a predictor needs to turn input lines into
    the model's inputs, in the serving layout the checkpoint (``meta``) records (of an
    older one, its data source's), described by that layout from meta.json alone
    (serving/layouts/; ``max_bag_size``: the places of a bag whose length varies, such
    as a Parquet list column's; ``training_data``: where an older checkpoint's training
    data is now, which its export reads)."""
    name = meta.serving_layout or SOURCES[meta.source_name].serving_layout
    if name not in LAYOUTS:
        raise BadInput(
            f"{checkpoint}/meta.json: serving_layout is {name}, a layout this code does not serve "
            f"({', '.join(LAYOUTS)})"
        )
    described = LAYOUTS[name].describe(Checkpoint(checkpoint, meta, model_config, max_bag_size, training_data))
    # The history features are the model's, whatever the layout (each layout reads them, or has no place for them).
    histories = [HistoryInput(history, item, model_config.max_history) for history, item in model_config.sequences]
    return ModelInputs(**vars(described), checkpoint=checkpoint, step=meta.step, histories=histories)


def export_model(
    checkpoint: str,
    output: str,
    quantize: list[str] | None,
    newest: bool = False,
    max_bag_size: int = DEFAULT_MAX_BAG_SIZE,
    fmt: str = PROGRAM_FORMAT,
    training_data: str | None = None,
    delta_from: str | None = None,
) -> ModelInputs:
    """Writes the model directory (see the module docstring); returns its inputs.json.
    ``quantize`` None: the default variants of the model (`default_quantize`).
    ``delta_from``: a full export; the directory becomes a delta export of the rows
    changed since it (serving/delta.py).

    Raises ExportError when ``output`` exists (a file, or a directory that is not
    empty), when another export to it is running, when the disk fills up, or (``fmt``
    aoti) without a C++ compiler.
    """
    return _export_checkpoint(checkpoint, output, quantize, newest, max_bag_size, fmt, training_data, delta_from)[0]


def _export_checkpoint(
    checkpoint: str,
    output: str,
    quantize: list[str] | None,
    newest: bool,
    max_bag_size: int,
    fmt: str,
    training_data: str | None = None,
    delta_from: str | None = None,
) -> tuple[ModelInputs, OpenedCheckpoint]:
    """`export_model`, and the checkpoint it opened (once: its manifest, meta.json and
    .metadata are read by every step of the export from that)."""
    _check_output(output)
    base = _delta_base(delta_from, quantize or [], fmt) if delta_from is not None else None
    if fmt == AOTI_FORMAT:
        _check_compiler()
    # Beside the output, held until the directory is renamed into place: a second
    # export to the same --output refuses (each would write its own staging directory,
    # and the slower one's rename would fail at the very end).
    parent, name = os.path.split(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    try:
        with PathLock(os.path.join(parent, f".{name}.lock"), f"--output {output}"):
            _check_output(output)  # an export that finished just before this one started
            return _write_model_dir(checkpoint, output, quantize, newest, max_bag_size, fmt, training_data, base)
    except LockHeld as e:
        raise ExportError(f"{e} (another export to it is running)") from e
    except OSError as e:
        if _no_space(e):
            raise ExportError(f"{e}; the partial export was removed") from e
        raise


def _delta_base(delta_from: str, quantize: list[str], fmt: str) -> Base:
    """The full export --delta_from names, refused up front when the delta cannot be
    taken from it: another format asked for, or a precision it has no program of."""
    if fmt != PROGRAM_FORMAT:
        raise BadInput(
            f"--delta_from with --format {fmt}: a delta holds the rows of torch.export programs; an "
            f"AOTInductor package holds its weights inside compiled code: export it in full"
        )
    base = Base.open(delta_from, "--delta_from")
    _check_base_programs(base, delta_from, quantize)
    return base


def _check_base_programs(base: Base, delta_from: str, quantize: list[str]) -> None:
    """Refuses a delta base without a torch.export program of each precision exported."""
    for precision in ["fp32", *quantize]:
        variant = base.inputs.variants.get(precision)
        if variant is None or variant.format != TORCH_EXPORT_FORMAT:
            have = [name for name, v in base.inputs.variants.items() if v.format == TORCH_EXPORT_FORMAT]
            raise BadInput(
                f"--delta_from {delta_from} has no {precision} program (it has {', '.join(have)}): "
                f"pass --quantize with those it has ({','.join(p for p in have if p != 'fp32') or 'none'})"
            )


def default_quantize(model: ModelConfig) -> list[str]:
    """The quantized variants an export writes unless --quantize says: fp16 and int8, none
    for a model with history features (its programs are fp32 only)."""
    return [] if model.sequence_columns else list(DEFAULT_QUANTIZE)


def _check_output(output: str) -> None:
    if os.path.exists(output) and not os.path.isdir(output):
        raise ExportError(f"--output {output} is an existing file: give the model directory to create")
    if os.path.isdir(output) and os.listdir(output):
        raise ExportError(f"--output {output} exists and is not empty: choose a new directory")


def _no_space(error: BaseException) -> bool:
    """Whether ``error`` (or the OSError it names a file for) is a full disk or quota."""
    causes = (error, error.__cause__)
    return any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in causes)


def _id_sketch_state(meta: CheckpointMeta) -> dict[str, Any]:
    """The seen-id filters (data/parquet/id_sketch.py) the checkpoint's meta.json
    records, as the state the model's load fills ({} for none); their facts are checked
    by the layout's describe."""
    facts = (meta.serving_facts or {}).get("id_sketch")
    if not isinstance(facts, dict) or not isinstance(facts.get("bits"), dict):
        return {}
    sizes = {name: bits for name, bits in facts["bits"].items() if isinstance(bits, int) and bits >= 8}
    return {"id_sketch": {name: torch.zeros(bits // 8, dtype=torch.uint8) for name, bits in sizes.items()}}


def _id_sketch_bytes(state: dict[str, Any], inputs: ModelInputs) -> bytes | None:
    """The model directory's SKETCH_FILE of the loaded filters; None when inputs.json records none."""
    facts = getattr(inputs.preprocessing, "id_sketch", None)
    if facts is None or not state:
        return None
    names = list(inputs.sparse_feature_names)
    return sketches_to_bytes([IdSketch(state["id_sketch"][name].numpy(), facts["ids"][name]) for name in names])


def _id_vocabulary_state(meta: CheckpointMeta) -> dict[str, Any]:
    """The id vocabulary (--id_hashing vocabulary; data/parquet/id_vocabulary.py) the
    checkpoint's meta.json records, as the state the model's load fills ({} for none)."""
    facts = (meta.serving_facts or {}).get("id_vocabulary")
    if facts is None:
        return {}
    names = list(meta.model.sparse_feature_names)
    try:
        from data.parquet.id_vocabulary import check_facts

        check_facts(facts, names, meta.model.num_embeddings_per_feature)
    except VocabularyError as e:
        raise ExportError(f"checkpoint meta.json: {e}") from None
    sizes = {n: facts["kept"][n] + facts["rare"][n] for n in names}
    return {"id_vocabulary": {n: torch.zeros(size, dtype=torch.int64) for n, size in sizes.items()}}


def _id_vocabulary_bytes(state: dict[str, Any], meta: CheckpointMeta, path: str) -> bytes | None:
    """The model directory's id vocabulary file of the loaded keys, checked against the
    facts (its digest: a checkpoint whose tensors are another vocabulary's is refused)."""
    if "id_vocabulary" not in state:
        return None
    names = list(meta.model.sparse_feature_names)
    facts = (meta.serving_facts or {})["id_vocabulary"]
    try:
        vocabulary = IdVocabulary.from_state(names, {n: state["id_vocabulary"][n].numpy() for n in names}, facts)
    except VocabularyError as e:
        raise ExportError(f"checkpoint {path}: its id vocabulary {e}") from None
    return vocabulary.to_bytes()


def _zch_id_map(train_model: Any, inputs: ModelInputs, path: str, delta: bool) -> bytes | None:
    """--id_hashing zch: the model's remapping as the directory's id map (data/parquet/zch_map.py),
    recorded in inputs.json; the model keeps its plain tables, which the map's rows index
    (the Parquet layout maps ids before the program runs). None for another model."""
    from models.zch import admitted_ids, plain_tables, zch_buckets, zch_tables

    zch = zch_tables(train_model)
    if zch is None:
        return None
    if delta:
        raise BadInput(f"--delta_from: {path} has zch tables (--id_hashing zch), whose id map a delta does not carry")
    names = list(inputs.sparse_feature_names)
    found = admitted_ids(zch)
    preprocessing: Any = inputs.preprocessing
    zch_map = ZchIdMap(
        names,
        [found[n][0] for n in names],
        [found[n][1] for n in names],
        [found[n][2] for n in names],
        preprocessing.hash_seed,
        zch_buckets(zch),
    )
    preprocessing.zch_ids = zch_map.facts()
    train_model.model.sparse_arch.embedding_bag_collection = plain_tables(zch)
    return zch_map.to_bytes()


def _write_model_dir(
    checkpoint: str,
    output: str,
    quantize: list[str] | None,
    newest: bool,
    max_bag_size: int,
    fmt: str,
    training_data: str | None,
    base: Base | None = None,
) -> tuple[ModelInputs, OpenedCheckpoint]:
    path = checkpoint_to_load(checkpoint, "--checkpoint", prefer_best=not newest)
    opened = open_checkpoint(path)
    if quantize is None:
        quantize = default_quantize(opened.meta.model)
        if base is not None:
            _check_base_programs(base, base.path, quantize)
    if opened.meta.model.sequence_columns and quantize:
        raise BadInput(
            f"--quantize {','.join(quantize)}: {path} has history features (--sequence_columns "
            f"{','.join(opened.meta.model.sequence_columns)}), exported in fp32 only: pass --quantize none"
        )
    sketch_state = {**_id_sketch_state(opened.meta), **_id_vocabulary_state(opened.meta)}
    train_model, meta = load_checkpoint_model(opened, sketch_state)
    id_vocabulary = _id_vocabulary_bytes(sketch_state, meta, path)
    model_config = meta.model
    inputs = describe_inputs(model_config, meta, path, max_bag_size, training_data)
    zch_map = _zch_id_map(train_model, inputs, path, base is not None)
    # --calibrate's fit on the validation that made the checkpoint (its meta.json), applied
    # inside every exported variant and recorded in inputs.json.
    inputs.calibration = meta.calibration
    vocabulary = _vocabulary(inputs)
    record = _delta_record(base, inputs, vocabulary, output) if base is not None else None
    if record is not None:
        vocabulary = None  # the base's serves: _delta_record checked it is the same
    sketch = _id_sketch_bytes(sketch_state, inputs)
    model = (SequenceProbabilityModel if inputs.histories else ProbabilityModel)(
        train_model.model,
        model_config.sparse_feature_names,
        inputs.sparse_hotness,
        concatenated_tables=bool(inputs.histories),  # the only lookup of history features
        padded=inputs.padded,
        calibration=meta.calibration,
    ).eval()

    with atomic_dir(output, replace=False) as tmp:  # an empty --output is replaced, checked above
        example = example_inputs(inputs)
        files = {}
        with torch.no_grad():
            for precision in ["fp32", *quantize]:
                program = (
                    fp32_program(model, example)
                    if precision == "fp32"
                    else quantized_program(model, QUANTIZED_DTYPES[precision], example)
                )
                if base is not None and record is not None:
                    file = delta_file(precision)
                    with naming_write_errors(os.path.join(output, file)):
                        record.regions[precision] = _write_delta(base, precision, program, tmp, output)
                    files[precision] = (file, DELTA_FORMAT)
                    continue
                file = program_file(precision)
                with naming_write_errors(os.path.join(output, file)):  # errors name the files as the output will
                    save_program(program, os.path.join(tmp, file))
                files[precision] = (file, TORCH_EXPORT_FORMAT)
                if fmt != AOTI_FORMAT:
                    continue
                package = aoti_file(precision)
                with naming_write_errors(os.path.join(output, package)):
                    compile_aoti(program, os.path.join(tmp, package))
                    write_triton_model(
                        tmp,
                        precision,
                        package,
                        model_config.dense_in_features,
                        sum(inputs.sparse_hotness),
                        len(inputs.histories),
                    )
                files[aoti_variant(precision)] = (package, AOTI_FORMAT)
        for name, (file, fmt) in files.items():
            inputs.variants[name] = Variant(file, fmt, os.path.getsize(os.path.join(tmp, file)))
        if vocabulary is not None:
            with naming_write_errors(os.path.join(output, VOCABULARY_FILE)):
                shutil.copyfile(vocabulary, os.path.join(tmp, VOCABULARY_FILE))
            inputs.preprocessing.vocabulary = VOCABULARY_FILE  # type: ignore[attr-defined]
        if id_vocabulary is not None:
            with naming_write_errors(os.path.join(output, ID_VOCABULARY_FILE)):
                with open(os.path.join(tmp, ID_VOCABULARY_FILE), "wb") as f:
                    f.write(id_vocabulary)
        if zch_map is not None:
            with naming_write_errors(os.path.join(output, ZCH_MAP_FILE)):
                with open(os.path.join(tmp, ZCH_MAP_FILE), "wb") as f:
                    f.write(zch_map)
        if sketch is not None:
            # A delta's filters as the bytes changed since its base's (they only grow), else whole.
            sketch_delta = _sketch_delta(base, record, sketch, inputs) if base is not None else None
            file = SKETCH_FILE if sketch_delta is None else SKETCH_DELTA_FILE
            with naming_write_errors(os.path.join(output, file)), open(os.path.join(tmp, file), "wb") as f:
                f.write(sketch if sketch_delta is None else sketch_delta)
        if record is not None:
            with naming_write_errors(os.path.join(output, DELTA_FILE)), open(os.path.join(tmp, DELTA_FILE), "wb") as f:
                f.write(record.to_json())
        # The directory is renamed whole below: its files need no temporary names.
        with naming_write_errors(os.path.join(output, INPUTS_FILE)), open(os.path.join(tmp, INPUTS_FILE), "wb") as f:
            f.write(inputs.to_json())
        with naming_write_errors(os.path.join(output, MANIFEST_FILE)):
            write_manifest(tmp)  # last: every file's size and SHA-256
    return inputs, opened


def _delta_record(base: Base, inputs: ModelInputs, vocabulary: str | None, output: str) -> DeltaRecord:
    """delta.json's record of a delta from ``base`` (its regions to come), after checking
    that the new model is the base's model (the same inputs, the same vocabulary)."""
    if vocabulary is not None:
        with open(vocabulary, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if base.manifest.get(VOCABULARY_FILE, {}).get("sha256") != digest:
            raise BadInput(
                f"--delta_from {base.path}: its {VOCABULARY_FILE} is not the training data's ({vocabulary}): "
                "the ids map to other rows: export in full"
            )
        inputs.preprocessing.vocabulary = VOCABULARY_FILE  # type: ignore[attr-defined]
    other = different_inputs(inputs, base.inputs)
    if other is not None:
        raise BadInput(
            f"--delta_from {base.path} is another model ({other} differ from the checkpoint's): a delta "
            "changes rows of the same tables: export in full"
        )
    return DeltaRecord(
        base_digest=base.digest,
        base_path=os.path.relpath(os.path.abspath(base.path), os.path.abspath(output)),
        base_step=base.inputs.step,
        base_checkpoint=base.inputs.checkpoint,
    )


def _sketch_delta(base: Base, record: DeltaRecord | None, sketch: bytes, inputs: ModelInputs) -> bytes | None:
    """SKETCH_DELTA_FILE's bytes of the new model's seen-id filters ``sketch`` against the
    base's: the bits they gained, coded (their entries and digest set in ``record``);
    None when they go whole: the base has none, they are not the base's grown
    (serving/delta.py's diff_sketches), or the code would not be smaller."""
    facts = getattr(inputs.preprocessing, "id_sketch", None)
    if record is None or facts is None or SKETCH_FILE not in base.manifest:
        return None
    names = list(inputs.sparse_feature_names)
    sizes = [facts["bits"][name] // 8 for name in names]
    if sum(sizes) != len(sketch) or base.manifest[SKETCH_FILE].get("bytes") != len(sketch):
        return None
    starts = np.cumsum([0, *sizes])
    before = np.frombuffer(read_file(base.path, SKETCH_FILE, base.manifest), np.uint8)
    after = np.frombuffer(sketch, np.uint8)
    cut = [(before[a:b], after[a:b]) for a, b in zip(starts[:-1], starts[1:])]
    diff = diff_sketches([b for b, _ in cut], [a for _, a in cut], names)
    if diff is None or len(diff[1]) >= len(sketch):  # not the base's grown, or most bits new: whole
        return None
    record.sketch_bits, payload = diff
    record.sketch_sha256 = hashlib.sha256(sketch).hexdigest()
    return payload


def _write_delta(base: Base, precision: str, program: torch.export.ExportedProgram, tmp: str, output: str) -> list:
    """Writes the .delta file of ``precision`` into ``tmp``: the bytes of ``program``'s
    weights that differ from the base's; returns its regions. Refused (BadInput) when
    the programs' graphs differ (the delta would give the base's graph other weights)."""
    file = delta_file(precision)
    if saved_graph(program) != base.graph(precision):
        raise BadInput(
            f"--delta_from {base.path}: its {precision} program is another graph than the checkpoint's (another "
            "model, calibration method or exporter version): export in full"
        )
    before = program_tensors(base.program(precision, "--delta_from"))
    after = program_tensors(program)
    regions, payload = diff_programs(before, after, os.path.join(output, file))
    check_applies(before, after, regions, payload)
    with _model_file(os.path.join(tmp, file)) as f:
        f.write(payload)
    return regions


def _vocabulary(inputs: ModelInputs) -> str | None:
    """The vocabulary file of Criteo data made with a frequency threshold (raw hashes go
    through it), to copy beside the model; None for other data. The one file of the
    training data an export reads: its absence (the data moved) is refused up front,
    as serving without it would map every hash to other rows than training did."""
    preprocessing = inputs.preprocessing
    if not (
        isinstance(preprocessing, CriteoPreprocessing) and inputs.data_path and preprocessing.frequency_threshold > 0
    ):
        return None
    vocabulary = os.path.join(inputs.data_path, VOCABULARY_FILE)
    if not os.path.exists(vocabulary):
        raise BadInput(
            f"{vocabulary}: no such file; the data was made with frequency threshold "
            f"{preprocessing.frequency_threshold}, and serving maps raw hashes through its vocabulary: "
            f"pass {TRAINING_DATA_FLAG} with where the Criteo directory is now"
        )
    return vocabulary


def format_sizes(inputs: ModelInputs) -> str:
    """One line per variant: name, file, format, size on disk."""
    return "\n".join(
        f"{name:>5}  {v.file:<9} {v.format:<13} {format_bytes(v.bytes):>10}" for name, v in inputs.variants.items()
    )


# What --quantize writes when not given, for a model without history features.
DEFAULT_QUANTIZE = ("fp16", "int8")


def _quantize_list(text: str) -> list[str]:
    names = [] if text == "none" else text.split(",")
    bad = [n for n in names if n not in QUANTIZED_DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown table precision {bad[0]!r}: use fp16, int8, fp16,int8 or none")
    return names


@dataclass(kw_only=True)
class ExportConfig:
    """What ``python -m serving.export`` exports, where to, and in which formats."""

    checkpoint: str = flag(help="a checkpoint, or a --checkpoint_dir (the checkpoint marked best, else the newest)")
    newest: bool = flag(False, help="with a --checkpoint_dir, its newest checkpoint even when one is marked best")
    output: str = flag(help="the model directory to create")
    quantize: list[str] | None = flag(
        None,
        parse=_quantize_list,
        help="quantized variants to write: fp16,int8, fp16, int8 or none (default: fp16,int8; none for a "
        "model with history features, whose programs are fp32 only)",
    )
    format: str = flag(
        PROGRAM_FORMAT,
        choices=EXPORT_FORMATS,
        help=f"{PROGRAM_FORMAT}: the torch.export programs of every precision, loaded without "
        f"running code; {AOTI_FORMAT}: also an AOTInductor package of each (compiled native code, "
        "for C++ servers and Triton's PyTorch backend: a triton/ model repository beside them)",
    )
    max_bag_size: int = flag(
        DEFAULT_MAX_BAG_SIZE,
        parse=positive_int,
        help="a model trained on Parquet: the ids a list column's bag may hold at serving (a longer bag is refused)",
    )
    delta_from: str | None = flag(
        None,
        help="a full export of the same model: write a delta export instead, only the table rows changed since "
        "it and the dense part, which serving.predict and serving.serve apply onto it",
    )
    training_data: str | None = flag(
        None,
        help="a checkpoint older than meta.json version 6, which does not record what serving needs of its "
        "data: where its training data (Parquet table, feature_spec.yaml, Criteo directory) is now",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = serving_parser("export", __doc__)
    (config,) = parse_config(parser, [ExportConfig], argv)
    quiet_benign_library_messages()  # notices every export prints that say nothing about this model
    return run_cli(lambda: _export(config), parser.prog)


def _export(config: ExportConfig) -> int:
    inputs, opened = _export_checkpoint(
        config.checkpoint,
        config.output,
        config.quantize,
        config.newest,
        config.max_bag_size,
        config.format,
        config.training_data,
        config.delta_from,
    )
    calibrated = f", calibrated: {inputs.calibration.describe()}" if inputs.calibration else ""
    delta = f" as a delta of {config.delta_from}" if config.delta_from is not None else ""
    print(
        f"exported {inputs.checkpoint} (step {inputs.step}{calibrated}) to {config.output}{delta}:\n"
        + format_sizes(inputs)
    )
    asked = opened.meta.config.get("calibrate", "none")
    if inputs.calibration is None and asked != "none":
        # A checkpoint saved at a step without a validation (--newest, a cadence save).
        print(
            f"note: the run had --calibrate {asked}, but this checkpoint holds no fit (no validation at its "
            "step): its probabilities are the model's own"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
