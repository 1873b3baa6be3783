"""`python -m sharding_plans plan|inspect|sweep` (see sharding_plans/cli.py)."""

from sharding_plans.cli import main

raise SystemExit(main())
