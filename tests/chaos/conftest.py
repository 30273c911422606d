import sys
from pathlib import Path

# The multi-process harness of tests/node (proc_cluster), for the chaos test here.
sys.path.append(str(Path(__file__).parents[1] / "node"))
