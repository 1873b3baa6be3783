"""Named machine presets: what one node of a job asks its scheduler for.

A preset is chosen with ``-h NAME`` on every component. Our own presets describe
common boxes on any cluster (Slurm, Kubernetes); the ``aws_*`` aliases and every
name in torchx's own registry (``torchx.specs.named_resources``, e.g.
``aws_g5.48xlarge``) add the EKS instance-type selector and EFA devices.

Example::

    resource = machine_resource("a100x8", memMB=500_000)   # 8 GPUs, less memory
"""

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional, Union

import torchx.specs as specs
from torchx.specs.finder import ComponentValidationException


class ComponentParameterError(ComponentValidationException, ValueError):  # type: ignore[misc]  # torchx: untyped
    """A component parameter is wrong (one line naming it). torchx prints a
    ComponentValidationException as its message, without the traceback it prints
    for any other exception."""


# A request for all of a node's memory never fits: the OS and the scheduler's
# daemons keep some. torchx's AWS presets ask for the same 96%.
USABLE_MEMORY_FRACTION = 0.96


@dataclass(frozen=True)
class Machine:
    """One kind of node.

    Args:
        description: what the machine is, for the README and errors.
        cpu: CPU cores (vCPUs) per node.
        gpu: GPUs per node.
        memory_gib: the node's RAM in GiB (the request is 96% of it).

    Example::

        Machine("8 x A100", cpu=96, gpu=8, memory_gib=1024).resource()
    """

    description: str
    cpu: int
    gpu: int
    memory_gib: int

    def resource(self) -> specs.Resource:
        return specs.Resource(cpu=self.cpu, gpu=self.gpu, memMB=int(self.memory_gib * 1024 * USABLE_MEMORY_FRACTION))


MACHINES: Dict[str, Machine] = {
    "cpu": Machine("any CPU node: local runs, tests, small experiments", cpu=4, gpu=0, memory_gib=16),
    "cpu_large": Machine("large CPU node: CPU training, Criteo preprocessing", cpu=64, gpu=0, memory_gib=256),
    "a100x1": Machine("1 x A100 (40/80 GB) node", cpu=12, gpu=1, memory_gib=85),
    "a100x8": Machine("8 x A100 (40/80 GB) node", cpu=96, gpu=8, memory_gib=1024),
    "h100x8": Machine("8 x H100 (80 GB) node", cpu=192, gpu=8, memory_gib=2048),
}

# Short names for torchx's AWS presets (instance-type node selector + EFA devices).
AWS_ALIASES: Dict[str, str] = {
    "aws_p4d": "aws_p4d.24xlarge",  # 8 x A100 40 GB, 96 vCPU, 1152 GiB, 4 EFA
    "aws_p4de": "aws_p4de.24xlarge",  # 8 x A100 80 GB
    "aws_p5": "aws_p5.48xlarge",  # 8 x H100 80 GB, 192 vCPU, 2048 GiB, 32 EFA
}


def machine_names() -> str:
    """The preset names, comma-separated, for help texts and errors."""
    return ", ".join([*MACHINES, *AWS_ALIASES])


def machine_resource(
    name: str,
    cpu: Optional[Union[int, str]] = None,
    gpu: Optional[Union[int, str]] = None,
    memMB: Optional[Union[int, str]] = None,
) -> specs.Resource:
    """The resource of one node of machine ``name``, with optional overrides.

    Args:
        name: one of ``MACHINES``, ``AWS_ALIASES`` or a torchx named resource.
        cpu, gpu, memMB: replace the preset's value when given (integers, or their
            decimal strings as the torchx CLI passes them).

    Raises:
        ValueError: unknown name, or an override that is not a count (one line).
    """
    if name in MACHINES:
        resource = MACHINES[name].resource()
    else:
        try:
            resource = specs.named_resources[AWS_ALIASES.get(name, name)]
        except KeyError:
            raise ComponentParameterError(
                f"-h {name}: unknown machine; use one of {machine_names()} "
                "or a torchx named resource such as aws_g5.48xlarge"
            ) from None
    overrides = {}
    for flag, value in {"cpu": cpu, "gpu": gpu, "memMB": memMB}.items():
        if value is not None:
            overrides[flag] = parse_count(flag, value, minimum=0 if flag == "gpu" else 1)
    return dataclasses.replace(resource, **overrides)


def parse_count(flag: str, value: Union[int, str], minimum: int) -> int:
    """``value`` as an int of at least ``minimum``, else ValueError naming ``--flag``."""
    # The torchx CLI hands Optional[int] parameters over as strings.
    try:
        number = int(value)
    except ValueError:
        raise ComponentParameterError(f"--{flag} {value}: not an integer") from None
    if number < minimum:
        raise ComponentParameterError(f"--{flag} {value}: must be at least {minimum}")
    return number
