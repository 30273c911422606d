"""The kind e2e runs the operator's scenarios of ``tests/operator/kq_scenarios.py``: one source,
two backends (the default suite runs them on the emulated cluster)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "operator"))
