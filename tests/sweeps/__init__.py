"""Tests of the sweeps package."""
