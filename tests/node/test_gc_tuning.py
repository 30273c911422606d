"""A serving node tunes Python's cyclic garbage collector (``main._tune_garbage_collector``).

Checked in a child interpreter: freezing this test process's objects would hide its garbage from
the collector until exit."""

from __future__ import annotations

import json
import subprocess
import sys

from quorum_node.node import main

_PROBE = """
import gc, json
from quorum_node.node import main
before = gc.get_threshold()
main._tune_garbage_collector()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_the_collector_freezes_start_up_and_runs_less_often() -> None:
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                           check=True, timeout=60)
    seen = json.loads(probe.stdout)
    assert seen["frozen"] > 0  # what start-up built is never walked again
    assert seen["after"][0] == main.GC_YOUNG_THRESHOLD > seen["before"][0]
    assert seen["after"][1:] == seen["before"][1:]
