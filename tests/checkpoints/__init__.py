"""Tests of the checkpoints package."""
