"""torchx component of the daily loop: ``torchx run daily ...`` (python -m training.daily).

Every function in this module is a component (torchx lists a module's functions).
Cron, a Slurm job and a Kubernetes CronJob start the same command: one node runs the
loop, which trains each new day in a subprocess; a restart (``max_retries``) reruns
the loop, which finishes the step it was killed in (docs/daily.md).

Example::

    torchx run -s slurm daily --state_dir /fsx/daily --parquet_path /fsx/clicks \\
        -- --dense_columns 'I*' --sparse_columns 'C*' --num_embeddings 20000
"""

from typing import Dict, List, Optional

import torchx.specs as specs

from torchx_components.launch import DEFAULT_IMAGE, bind_mounts
from torchx_components.machines import ComponentParameterError, machine_resource, parse_count


def daily(
    *script_args: str,
    state_dir: str,
    parquet_path: str,
    time_column: str = "date",
    nproc_per_node: int = 1,
    h: str = "cpu",
    cpu: Optional[int] = None,
    gpu: Optional[int] = None,
    memMB: Optional[int] = None,
    image: str = DEFAULT_IMAGE,
    name: str = "daily",
    env: Optional[Dict[str, str]] = None,
    mounts: Optional[List[str]] = None,
    max_retries: int = 0,
) -> specs.AppDef:
    """Trains each new day of a Parquet lake, exports, gates and promotes it (python -m training.daily) on one node.

    Args:
        script_args: training flags, passed to each day's run unchanged (after --), e.g. --dense_columns 'I*'
        state_dir: the loop's state directory (state.json, days/, the current link); mounted read-write at the same path
        parquet_path: the lake, one date=DAY partition directory per day; mounted read-only at the same path
        time_column: the partition key of the days
        nproc_per_node: ranks of each day's training run (on GPU machines at most one per GPU)
        h: machine preset of the node: cpu, cpu_large, ... (as for dlrm); the request must fit one node (see dlrm's h)
        cpu: CPUs, replacing the preset's; at most a node's CPUs
        gpu: GPUs, replacing the preset's
        memMB: memory in MB, replacing the preset's (0.96 x its RAM); at most a node's memory
        image: container image holding this repository (ignored by local_cwd and Slurm)
        name: job name
        env: environment variables
        mounts: more mounts: type=bind|volume|device,src=SRC,dst=DST[,readonly]
        max_retries: times the scheduler restarts the job; a restart finishes the step the loop was in
    """
    resource = machine_resource(h, cpu=cpu, gpu=gpu, memMB=memMB)
    ranks = parse_count("nproc_per_node", nproc_per_node, 1)
    if max_retries < 0:
        raise ComponentParameterError(f"--max_retries {max_retries}: must be >= 0")
    args = [
        "-m",
        "training.daily",
        "--state_dir",
        state_dir,
        "--parquet_path",
        parquet_path,
        "--time_column",
        time_column,
        "--nproc_per_node",
        str(ranks),
        *script_args,
    ]
    lake = [] if "://" in parquet_path else [parquet_path]
    return specs.AppDef(
        name=name,
        roles=[
            specs.Role(
                name="daily",
                image=image,
                entrypoint="python",
                args=args,
                env={"PYTHONUNBUFFERED": "1", **(env or {})},
                resource=resource,
                max_retries=max_retries,
                mounts=specs.parse_mounts(bind_mounts(lake, [state_dir], mounts or [])),
            )
        ],
    )
