"""The public TorchRec DLRM example's torchx component, with the machine chosen by -h.

    torchx run --scheduler slurm --scheduler_args partition=PART,time=5:00:00 \
        aws_component.py:run_dlrm_main --num_trainers=16 -- --batch_size 2048 ...

Trainers are GPUs: up to 8 run on one node, more span nodes of 8 (so more than 8
must be a multiple of 8). Everything else is the `dlrm` component
(torchx_components/training.py).
"""

from typing import Dict, List, Optional

import torchx.specs as specs

# torchx loads this file by path, without its folder on sys.path: the components come
# from the installed package (`make install`).
from torchx_components.launch import DEFAULT_IMAGE
from torchx_components.machines import ComponentParameterError
from torchx_components.training import dlrm

TRAINERS_PER_NODE = 8


def run_dlrm_main(
    num_trainers: int = 8,
    *script_args: str,
    h: str = "aws_p4d",
    image: str = DEFAULT_IMAGE,
    name: str = "train_dlrm",
    env: Optional[Dict[str, str]] = None,
    data_dir: Optional[str] = None,
    checkpoint_dir: Optional[str] = None,
    mounts: Optional[List[str]] = None,
    max_retries: int = 0,
) -> specs.AppDef:
    """Trains DLRM (dlrm_main.py) on num_trainers GPUs, 8 per node.

    Args:
        num_trainers: trainer processes (GPUs): 1 to 8 on one node, or a multiple of 8 over several nodes
        script_args: flags for dlrm_main.py (after --)
        h: machine preset of each node: aws_p4d, aws_p4de, aws_p5, a100x8, h100x8, ... (see the dlrm component)
        image: container image holding this repository (ignored by local_cwd and Slurm)
        name: job name, {experiment}/{run} or {run}
        env: environment variables for every rank
        data_dir: data directory every node sees; mounted read-only and passed as --in_memory_binary_criteo_path unless the flags give a data path
        checkpoint_dir: checkpoint directory every node sees; mounted read-write and passed as --checkpoint_dir DIR --resume
        mounts: more mounts: type=bind|volume|device,src=SRC,dst=DST[,readonly]
        max_retries: times the scheduler restarts the job after a failure
    """
    if num_trainers < 1:
        raise ComponentParameterError(f"--num_trainers {num_trainers}: must be at least 1")
    if num_trainers > TRAINERS_PER_NODE and num_trainers % TRAINERS_PER_NODE != 0:
        raise ComponentParameterError(
            f"--num_trainers {num_trainers}: more than {TRAINERS_PER_NODE} trainers span nodes of "
            f"{TRAINERS_PER_NODE} and must be a multiple of {TRAINERS_PER_NODE} "
            f"(e.g. {num_trainers // TRAINERS_PER_NODE * TRAINERS_PER_NODE} or "
            f"{(num_trainers // TRAINERS_PER_NODE + 1) * TRAINERS_PER_NODE})"
        )
    nodes = max(num_trainers // TRAINERS_PER_NODE, 1)
    per_node = min(num_trainers, TRAINERS_PER_NODE)
    return dlrm(
        *script_args,
        j=f"{nodes}x{per_node}",
        h=h,
        image=image,
        name=name,
        env=env,
        data_dir=data_dir,
        checkpoint_dir=checkpoint_dir,
        mounts=mounts,
        max_retries=max_retries,
    )
