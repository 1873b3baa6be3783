"""Tests of the scripts package."""
