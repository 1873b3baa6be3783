"""torchx components of this repository: ``dlrm``, ``dcnv2`` (training) and
``preprocess_criteo``, registered under the ``torchx.components`` entry point by
``pyproject.toml`` (``make install`` installs it), so ``torchx run dlrm ...`` works.

They import only torchx, the standard library and the project's torch-free flag
modules (the data-path flags come from data/sources/'s registry): the torchx CLI
imports them on the submitting machine, which need not have torch or numpy.

Their signatures keep ``typing.List``/``Dict`` where the rest of the project writes
``list``/``dict``: torchx's component reader (``torchx.specs.file_linter``) recognises
only the ``typing`` spellings, and a component with ``list[str]`` is not listed at all.
"""
