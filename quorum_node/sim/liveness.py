"""Progress expectations scenarios place after a fault heals (or while a majority stays healthy):
something proposed after a point in time gets committed, lagging replicas catch up, lost disks'
voters get replaced, and a cut-off minority commits nothing new."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from quorum_node.sim.simulation import LIVENESS, NO_MINORITY_COMMIT, Simulation


def expect_commit_since(sim: Simulation, since_ms: int, by_ms: int) -> None:
    """By ``by_ms`` a leader must have committed a record proposed at or after ``since_ms``."""

    def check() -> None:
        newest = sim.checker.newest_committed_proposal_ms
        if newest < since_ms:
            leader = sim.cluster.leader()
            sim.fail(
                LIVENESS,
                f"nothing proposed since {since_ms} ms was committed by {by_ms} ms "
                f"(newest committed proposal: {newest} ms; leader now: "
                f"{leader.node_id if leader is not None else None})",
            )

    sim.at(by_ms, check)


def expect_caught_up(sim: Simulation, target_at_ms: int, by_ms: int) -> None:
    """Every running node's high watermark reaches, by ``by_ms``, the committed prefix as it was
    at ``target_at_ms``."""
    target = 0

    def snapshot() -> None:
        nonlocal target
        target = sim.checker.committed_end

    def check() -> None:
        for node in sim.cluster.alive():
            assert node.core is not None
            high_watermark = node.core.high_watermark
            if high_watermark is None or high_watermark < target:
                sim.fail(
                    LIVENESS,
                    f"node {node.node_id} ({node.core.state}, epoch {node.core.epoch}) has "
                    f"high watermark {high_watermark} at {by_ms} ms, below {target} committed "
                    f"by {target_at_ms} ms",
                )
                return

    sim.at(target_at_ms, snapshot)
    sim.at(by_ms, check)


def expect_recovery(sim: Simulation, since_ms: int, window_ms: int) -> None:
    """Within ``window_ms`` of ``since_ms`` there is progress, and every running node catches up
    with what was committed half-way through."""
    expect_commit_since(sim, since_ms, since_ms + window_ms)
    expect_caught_up(sim, since_ms + window_ms // 2, since_ms + window_ms)


def expect_remediated(
    sim: Simulation, since_ms: int, window_ms: int, then: Callable[[], None] = lambda: None
) -> None:
    """From ``since_ms``, within ``window_ms``: the committed voters are the configured ids, each
    under the directory its node has now (KIP-856's recovery is complete), with no change
    pending; then ``then``."""

    def remediated() -> bool | None:
        leader = sim.cluster.leader()
        if leader is None or leader.core is None or leader.core.pending_voter_change is not None:
            return None
        expected = sim.operator.remediated_voters()
        committed = tuple(sorted(sim.checker.committed_voter_set()))
        return True if committed == expected == tuple(sorted(leader.core.voters)) else None

    def wait() -> None:
        sim.wait_for(
            "remediated voter set (the configured ids under their current directories)",
            remediated,
            lambda _: then(),
            timeout_ms=window_ms,
        )

    sim.at(since_ms, wait)


def watch_no_commit_since(
    sim: Simulation, node_ids: Iterable[int], since_ms: int
) -> Callable[[], None]:
    """While installed, after every event: no node of ``node_ids`` (a minority cut off since
    ``since_ms``) counts as committed a record proposed at or after ``since_ms``. Returns the
    function that uninstalls it."""
    nodes = [sim.cluster.nodes[node_id] for node_id in node_ids]
    checked: dict[int, tuple[int, int]] = {}  # node -> (incarnation, high watermark checked)

    def watch() -> None:
        for node in nodes:
            high_watermark = node.core.high_watermark if node.core is not None else None
            if high_watermark is None:
                continue
            incarnation, start = checked.get(node.node_id, (node.incarnation, 0))
            if incarnation != node.incarnation:
                start = 0
            checked[node.node_id] = (node.incarnation, max(start, high_watermark))
            for offset in range(start, high_watermark):
                batch = node.log.batch_containing(offset)
                if batch is None or batch.is_control:
                    continue  # a missing offset is ConsistentCommittedData's to report
                value = batch.records[offset - batch.base_offset].value
                proposed = sim.workload.proposed_at.get(value)
                if proposed is not None and proposed >= since_ms:
                    sim.fail(
                        NO_MINORITY_COMMIT,
                        f"node {node.node_id}, cut off in a minority since {since_ms} ms, has "
                        f"high watermark {high_watermark} covering offset {offset}, proposed at "
                        f"{proposed} ms",
                    )
                    return

    sim.watches.append(watch)
    return lambda: sim.watches.remove(watch)
