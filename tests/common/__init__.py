"""Tests of the common package."""
