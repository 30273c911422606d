"""A serving node tunes Python's cyclic garbage collector (``main._build_frozen``,
``main.tune_garbage_collector``).

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
main.tune_garbage_collector()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_the_collector_freezes_start_up_and_runs_less_often() -> None:
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                           check=True, timeout=60)
    seen = json.loads(probe.stdout)
    assert seen["frozen"] > 0  # what start-up built is never walked again
    assert seen["after"][0] == main.GC_YOUNG_THRESHOLD > seen["before"][0]
    assert seen["after"][1:] == seen["before"][1:]


_BUILD_PROBE = """
import gc, json
from quorum_node.node import main
seen = {}
def build_node(config):
    seen.setdefault("enabled_while_building", gc.isenabled())
    seen.setdefault("frozen_before", gc.get_freeze_count())
    objects = [(str(i), i) for i in range(1000)]  # what a snapshot's load would keep
    if config == "fail":
        raise OSError("the log directory is unreadable")
    return objects
main.build_node = build_node
built = main._build_frozen("ok")
seen["frozen_after"] = gc.get_freeze_count()
seen["enabled_after"] = gc.isenabled()
try:
    main._build_frozen("fail")
except OSError:
    seen["enabled_after_a_failure"] = gc.isenabled()
print(json.dumps(seen))
"""


def test_the_node_is_built_without_collections_and_frozen() -> None:
    probe = subprocess.run([sys.executable, "-c", _BUILD_PROBE], capture_output=True, text=True,
                           check=True, timeout=60)
    seen = json.loads(probe.stdout)
    assert seen["enabled_while_building"] is False  # a snapshot's load is not walked
    assert seen["frozen_after"] >= seen["frozen_before"] + 1000  # nor ever again
    assert seen["enabled_after"] is True
    assert seen["enabled_after_a_failure"] is True
