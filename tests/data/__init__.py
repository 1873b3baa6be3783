"""Tests of the data package."""
