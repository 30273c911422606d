"""A serving node tunes Python's cyclic garbage collector (``runtime._tune_garbage_collector``)."""

from __future__ import annotations

import gc

from quorum_node.node import runtime


def test_the_collector_freezes_start_up_and_runs_less_often() -> None:
    threshold = gc.get_threshold()
    try:
        runtime._tune_garbage_collector()
        assert gc.get_freeze_count() > 0  # what start-up built is never walked again
        assert gc.get_threshold()[0] == runtime.GC_YOUNG_THRESHOLD > threshold[0]
        assert gc.get_threshold()[1:] == threshold[1:]
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
