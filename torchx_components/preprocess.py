"""torchx component that preprocesses raw Criteo click logs: ``torchx run preprocess_criteo ...``.

Every function in this module is a component (torchx lists a module's functions).

Example::

    torchx run -s slurm preprocess_criteo --input_dir /fsx/criteo_raw --output_dir /fsx/criteo \\
        -- --frequency_threshold 3
"""

from typing import Dict, List, Optional

import torchx.specs as specs

from torchx_components.launch import DEFAULT_IMAGE, bind_mounts
from torchx_components.machines import ComponentParameterError, machine_resource, parse_count


def preprocess_criteo(
    *script_args: str,
    input_dir: str,
    output_dir: str,
    dataset_name: str = "criteo_1t",
    workers: Optional[int] = None,
    h: str = "cpu_large",
    cpu: Optional[int] = None,
    memMB: Optional[int] = None,
    image: str = DEFAULT_IMAGE,
    name: str = "preprocess_criteo",
    env: Optional[Dict[str, str]] = None,
    mounts: Optional[List[str]] = None,
    max_retries: int = 0,
) -> specs.AppDef:
    """Preprocesses raw Criteo click logs (python -m data.preprocess_criteo) on one node.

    Args:
        script_args: more preprocessing flags, passed unchanged (after --), e.g. --frequency_threshold 3
        input_dir: raw day files (criteo_1t) or train.txt (criteo_kaggle); mounted read-only at the same path
        output_dir: where the binary layout is written; mounted read-write at the same path
        dataset_name: criteo_1t or criteo_kaggle
        workers: day files processed in parallel (default: the node's CPUs, at most 24)
        h: machine preset of the node: cpu, cpu_large, ... (as for dlrm); the request must fit one node (see dlrm's h: on Slurm more CPUs than a node has stays pending forever)
        cpu: CPUs, replacing the preset's; at most a node's CPUs
        memMB: memory in MB, replacing the preset's (0.96 x its RAM); at most a node's memory
        image: container image holding this repository (ignored by local_cwd and Slurm)
        name: job name
        env: environment variables
        mounts: more mounts: type=bind|volume|device,src=SRC,dst=DST[,readonly]
        max_retries: times the scheduler restarts the job; a restart skips the days already finished
    """
    resource = machine_resource(h, cpu=cpu, memMB=memMB)
    # Criteo 1TB has 24 day files: more workers than that would idle.
    worker_count = min(resource.cpu, 24) if workers is None else parse_count("workers", workers, 1)
    if max_retries < 0:
        raise ComponentParameterError(f"--max_retries {max_retries}: must be >= 0")
    args = [
        "-m",
        "data.preprocess_criteo",
        "--input_dir",
        input_dir,
        "--output_dir",
        output_dir,
        "--dataset_name",
        dataset_name,
        "--workers",
        str(worker_count),
        *script_args,
    ]
    return specs.AppDef(
        name=name,
        roles=[
            specs.Role(
                name="preprocess_criteo",
                image=image,
                entrypoint="python",
                args=args,
                env={"PYTHONUNBUFFERED": "1", **(env or {})},
                resource=resource,
                max_retries=max_retries,
                mounts=specs.parse_mounts(bind_mounts([input_dir], [output_dir], mounts or [])),
            )
        ],
    )
