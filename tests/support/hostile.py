"""Settings shared by the generated hostile-input suites (tests/test_hostile_*.py).

`make test` draws HOSTILE_EXAMPLES (default 10) cases per property, the same ones every
run (derandomized: a failure in CI reproduces); `make test-hostile` draws 200.
"""

import os

from hypothesis import HealthCheck, settings

HOSTILE_EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "10"))
# Fixtures are function-scoped copies of a real checkpoint or model; each case is slow
# by hypothesis' measure (it loads a model), which is the point.
HOSTILE_SETTINGS = settings(max_examples=HOSTILE_EXAMPLES, deadline=None, derandomize=True,
                            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
