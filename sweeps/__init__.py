"""Training sweeps: many configurations of one entry point, launched through torchx
and compared in one table (``python -m sweeps run|report|status``).

A sweep file (``sweeps.spec``) names the entry point, the scheduler, the flags every
run shares and a grid of flag values; every point of the grid is one job of this
repository's torchx components, with its own run directory and JSON-lines log. Only
checking the flags against the training parser and the planner's memory estimate
import torch; the rest needs torchx and the standard library.
"""
