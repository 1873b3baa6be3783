"""Size and load time of the exported fp32 program against the number of categorical features.

For each feature count, builds the default architecture (dim 64, bottom 512-256-64,
top 512-512-256-1, 13 numerical features) with small tables (``--rows`` each: the graph,
not the weights, is what grew), exports it as ``serving.export`` writes fp32.pt2, and
reports the graph's nodes, the program's JSON and file bytes, the export time and the
best of ``--repeats`` ``torch.export.load`` times (with ``.module()``, as predict and
serve load it) against the 10 s goal. The peer, in the same run: the previous export
(TorchRec's collection, a lookup chain per feature) at the ``--chain_features`` counts.

    python bench/export_load.py [--features 26,100,200,500] [--rows 100] [--chain_features 26] [--repeats 3]
"""

import json
import os
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.binary.criteo_layout import NUM_DENSE_FEATURES
from models import ModelConfig, build_dlrm_train
from serving.export import export_program
from serving.inference_model import ProbabilityModel

LOAD_GOAL_SECONDS = 10.0


def _int_list(text: str) -> list[int]:
    """Parses "26,100"; "" is no counts (``--chain_features ""`` skips the previous way)."""
    return [int(v) for v in text.split(",") if v]


def measure(num_features: int, rows: int, concatenated_tables: bool, directory: str, repeats: int) -> dict:
    """Exports one model and loads it ``repeats`` times; returns its figures."""
    names = [f"cat_{f}" for f in range(num_features)]
    config = ModelConfig([rows] * num_features, sparse_feature_names=names, dense_in_features=NUM_DENSE_FEATURES)
    dlrm = build_dlrm_train(config, embedding_device=torch.device("cpu")).model
    model = ProbabilityModel(dlrm, names, concatenated_tables=concatenated_tables)
    example = (torch.zeros(4, config.dense_in_features), torch.zeros(4, num_features, dtype=torch.int64))
    path = os.path.join(directory, f"{num_features}_{concatenated_tables}.pt2")
    start = time.perf_counter()
    with torch.no_grad():
        program = export_program(model, example)
    torch.export.save(program, path)
    export_seconds = time.perf_counter() - start
    file_bytes = os.path.getsize(path)
    with zipfile.ZipFile(path) as archive:
        graph_bytes = sum(i.file_size for i in archive.infolist() if "/models/" in i.filename)
    load_seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.export.load(path).module()
        load_seconds.append(time.perf_counter() - start)
    os.remove(path)
    return {
        "features": num_features,
        "lookup": "concatenated" if concatenated_tables else "per-feature chain",
        "graph_nodes": len(program.graph.nodes),
        "graph_json_bytes": graph_bytes,
        "file_bytes": file_bytes,
        "export_seconds": export_seconds,
        "load_seconds": min(load_seconds),
    }


@dataclass
class ExportLoadFlags:
    """The flags of ``python bench/export_load.py``: what it measures and how."""

    features: list[int] = flag(
        [26, 100, 200, 500], parse=_int_list, help="feature counts to export and load, comma-separated"
    )
    rows: int = flag(100, help="rows of every table")
    chain_features: list[int] = flag(
        [26],
        parse=_int_list,
        help="feature counts to export the previous way too (a chain per feature: "
        "it loads in minutes from about 100 features)",
    )
    repeats: int = flag(3, help="loads per program (the best is reported)")
    num_threads: int = flag(1, help="torch intra-op threads")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), ExportLoadFlags, argv)
    torch.set_num_threads(args.num_threads)
    runs = [(f, True) for f in args.features] + [(f, False) for f in args.chain_features]
    with tempfile.TemporaryDirectory() as directory:
        results = [measure(f, args.rows, concatenated, directory, args.repeats) for f, concatenated in runs]
    print(f"fp32 program of the default architecture, tables of {args.rows} rows, best of {args.repeats} loads:")
    print(
        f"{'features':>8}  {'lookup':<17} {'nodes':>6} {'graph JSON':>11} {'file':>10} {'export':>8} "
        f"{'load':>8} {'load / 10 s goal':>16}"
    )
    for r in results:
        print(
            f"{r['features']:>8}  {r['lookup']:<17} {r['graph_nodes']:>6} {r['graph_json_bytes'] / 1e6:>8.2f} MB "
            f"{r['file_bytes'] / 1e6:>7.1f} MB {r['export_seconds']:>7.2f}s {r['load_seconds']:>7.2f}s "
            f"{r['load_seconds'] / LOAD_GOAL_SECONDS:>16.3f}"
        )
    print(
        json.dumps(
            {
                "benchmark": "export_load",
                "rows": args.rows,
                "repeats": args.repeats,
                "goal_seconds": LOAD_GOAL_SECONDS,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
