"""Tests of the sharding_plans package."""
