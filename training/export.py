"""Exports a (sharded) training checkpoint as single-host inference models.

    python -m training.export --checkpoint CKPT --output MODEL_DIR [--quantize fp16,int8]

CKPT is one checkpoint (``.../step_000000100``) or a ``--checkpoint_dir`` (its newest
complete checkpoint). It is loaded in this one process, whatever the world size and
sharding plan it was saved with. MODEL_DIR receives:

    fp32.pt2       torch.export program, dynamic batch dimension
    fp16.pt        TorchScript, fp16 embedding tables (torchrec inference quantization)
    int8.pt        TorchScript, int8 row-wise quantized embedding tables
    inputs.json    feature names, table sizes, dense count, the preprocessing to apply
                   to raw lines, and each variant's file and size on disk
    vocabulary.npz the preprocessing's vocabulary, when the data was made with a
                   frequency threshold

Every variant maps (dense (B, 13) float32 transformed, sparse (B, 26) int64 ids) to
click probabilities (B,). The directory is written under a temporary name and renamed
when complete. Bad input: one line on stderr, exit 2.
"""

import argparse
import copy
import json
import os
import shutil
import sys
import warnings
from typing import Any, Dict, List, Optional, Sequence

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
from torchrec.fx import symbolic_trace
from torchrec.inference.modules import quantize_inference_model

from data.criteo_layout import DENSE_FEATURE_NAMES, read_metadata
from data.preprocess_criteo import DENSE_OFFSET, VOCABULARY_FILE
from models.config import ModelConfig
from sharding_plans.report import format_bytes
from training.checkpoint import META_FILE, CheckpointError, newest_checkpoint
from training.inference_model import INPUTS_FILE, ProbabilityModel, load_checkpoint_model

FP32_FILE = "fp32.pt2"
QUANTIZED_DTYPES = {"fp16": torch.float16, "int8": torch.int8}
INPUTS_FORMAT_VERSION = 1


def resolve_checkpoint(path: str) -> str:
    """A checkpoint directory, or the newest complete one of a --checkpoint_dir."""
    if os.path.exists(os.path.join(path, META_FILE)):
        return path
    newest = newest_checkpoint(path)
    if newest is None:
        raise CheckpointError(f"--checkpoint {path}: neither a checkpoint nor a directory holding a complete one")
    return newest


def export_fp32(model: ProbabilityModel, example: Sequence[torch.Tensor], path: str) -> None:
    """torch.export with a dynamic batch dimension (non-strict: TorchRec's KJT is Python)."""
    batch = torch.export.Dim("batch", min=1, max=1 << 24)
    program = torch.export.export(model, tuple(example), dynamic_shapes={"dense": {0: batch}, "sparse": {0: batch}},
                                  strict=False)
    torch.export.save(program, path)


def export_quantized(model: ProbabilityModel, dtype: torch.dtype, path: str) -> None:
    """Quantizes every table to ``dtype``, fx-traces (FBGEMM's kernel module is a leaf)
    and saves TorchScript (torch.export cannot take FBGEMM's inference kernels)."""
    table_names = list(model.dlrm.sparse_arch.embedding_bag_collection.embedding_bags.keys())
    quantized = quantize_inference_model(copy.deepcopy(model.dlrm),
                                         per_table_weight_dtype={t: dtype for t in table_names})
    wrapped = ProbabilityModel(quantized, model.sparse_feature_names).eval()
    traced = symbolic_trace(wrapped, leaf_modules=[IntNBitTableBatchedEmbeddingBagsCodegen.__name__])
    torch.jit.save(torch.jit.script(traced), path)


def describe_inputs(model_config: ModelConfig, data_path: Optional[str]) -> Dict[str, Any]:
    """inputs.json without the variants: what a predictor needs to turn raw lines into inputs."""
    metadata = (read_metadata(data_path) if data_path else None) or {}
    return {
        "format_version": INPUTS_FORMAT_VERSION,
        "dense_feature_names": list(DENSE_FEATURE_NAMES),
        "num_dense_features": model_config.dense_in_features,
        "sparse_feature_names": list(model_config.sparse_feature_names),
        "table_names": model_config.table_names,
        "num_embeddings_per_feature": list(model_config.num_embeddings_per_feature),
        "embedding_dim": model_config.embedding_dim,
        "interaction_type": model_config.interaction_type,
        "inputs": {"dense": "float32 (B, num_dense_features), transformed",
                   "sparse": "int64 (B, 26), one id per feature, below its table size"},
        "output": "float32 (B,) click probability",
        "preprocessing": {
            "dense_offset": DENSE_OFFSET,
            "frequency_threshold": int(metadata.get("frequency_threshold") or 0),
            "modulo_num_embeddings_per_feature": metadata.get("modulo_num_embeddings_per_feature"),
            "vocabulary": None,
        },
        "data_path": data_path,
    }


def export_model(checkpoint: str, output: str, quantize: List[str]) -> Dict[str, Any]:
    """Writes the model directory (see the module docstring); returns its inputs.json."""
    path = resolve_checkpoint(checkpoint)
    if os.path.exists(output) and os.listdir(output):
        raise ValueError(f"--output {output} exists and is not empty: choose a new directory")
    train_model, meta = load_checkpoint_model(path)
    model_config = ModelConfig(**meta["model"])
    model = ProbabilityModel(train_model.model, model_config.sparse_feature_names).eval()
    data_path = meta.get("config", {}).get("data", {}).get("in_memory_binary_criteo_path")
    inputs = describe_inputs(model_config, data_path)
    inputs.update(checkpoint=path, step=meta.get("step"), variants={})

    tmp = f"{output.rstrip('/')}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        example = (torch.zeros(4, model_config.dense_in_features),
                   torch.zeros(4, len(model_config.sparse_feature_names), dtype=torch.int64))
        with torch.no_grad():
            export_fp32(model, example, os.path.join(tmp, FP32_FILE))
            for name in quantize:
                export_quantized(model, QUANTIZED_DTYPES[name], os.path.join(tmp, f"{name}.pt"))
        files = {"fp32": (FP32_FILE, "torch.export")}
        files.update({name: (f"{name}.pt", "torchscript") for name in quantize})
        for name, (file, fmt) in files.items():
            inputs["variants"][name] = {"file": file, "format": fmt,
                                        "bytes": os.path.getsize(os.path.join(tmp, file))}
        vocabulary = os.path.join(data_path, VOCABULARY_FILE) if data_path else None
        if inputs["preprocessing"]["frequency_threshold"] > 0 and vocabulary and os.path.exists(vocabulary):
            shutil.copyfile(vocabulary, os.path.join(tmp, VOCABULARY_FILE))
            inputs["preprocessing"]["vocabulary"] = VOCABULARY_FILE
        with open(os.path.join(tmp, INPUTS_FILE), "w") as f:
            json.dump(inputs, f, indent=1)
        if os.path.exists(output):
            os.rmdir(output)  # empty, checked above
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return inputs


def format_sizes(inputs: Dict[str, Any]) -> str:
    """One line per variant: name, file, format, size on disk."""
    return "\n".join(f"{name:>5}  {v['file']:<9} {v['format']:<13} {format_bytes(v['bytes']):>10}"
                     for name, v in inputs["variants"].items())


def _quantize_list(text: str) -> List[str]:
    names = [] if text == "none" else text.split(",")
    bad = [n for n in names if n not in QUANTIZED_DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown table precision {bad[0]!r}: use fp16, int8, fp16,int8 or none")
    return names


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoint, or a --checkpoint_dir (its newest)")
    parser.add_argument("--output", required=True, help="the model directory to create")
    parser.add_argument("--quantize", type=_quantize_list, default=["fp16", "int8"],
                        help="quantized variants to write: fp16,int8 (default), fp16, int8 or none")
    args = parser.parse_args(argv)
    # Library notices that every export prints and that say nothing about this model.
    for message in ("torch.distributed is disabled", "The TorchScript type system", "TorchScript will treat"):
        warnings.filterwarnings("ignore", message=message)
    try:
        inputs = export_model(args.checkpoint, args.output, args.quantize)
    except ValueError as e:  # CheckpointError included
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"exported {inputs['checkpoint']} (step {inputs['step']}) to {args.output}:\n" + format_sizes(inputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
