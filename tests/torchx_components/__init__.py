"""Tests of the torchx_components package."""
