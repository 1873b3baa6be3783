"""Training sweeps: many configurations of one entry point, launched through torchx
and compared in one table (``python -m sweeps run|report|status``).

A sweep file (``sweeps.spec``) names the entry point, the scheduler, the flags every
run shares and what varies (a grid, zipped flags, named values, seeds, or a seeded
random search); every configuration is one job (per seed) of this repository's torchx
components, with its own run directory and JSON-lines log. Only
checking the flags against the training parser and the planner's memory estimate
import torch; the rest needs torchx and the standard library.
"""
