"""The chart's monitoring (alert rules, dashboard) against what real nodes and the operator
export: node processes from tests/node's harness (proc_cluster), the operator on the emulated
cluster of tests/operator (kq_cluster), the chart rendered by helm/render_install.py."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).parents[1] / "node"))  # proc_cluster
sys.path.append(str(Path(__file__).parents[1] / "operator"))  # kq_cluster
