"""Which observers the leader offers as voters (KIP-856's CouldBeVoters), and which it marks as
a node's retired disk: shared by DescribeQuorum, the metrics and the leader's log."""

from __future__ import annotations

from collections.abc import Container, Iterable

from quorum_node.raft.leader import ReplicaDescription


def could_be_voter(observer: ReplicaDescription, voter_ids: Container[int],
                   voters: Iterable[ReplicaDescription]) -> bool:
    """Whether AddVoter could make this observer a voter: it fetches with a directory id, its id
    is a configured voter's (the leader refuses any other id, KIP-856), and it is no retired
    directory (``retired_directory``)."""
    return (observer.key.directory_id is not None and observer.key.id in voter_ids
            and not retired_directory(observer, voters))


def retired_directory(observer: ReplicaDescription,
                      voters: Iterable[ReplicaDescription]) -> bool:
    """Whether the observer is a replaced disk: another directory of its node id is a voter and
    has fetched since it last did (the leader's own row is "now"). A node runs one directory at
    a time, so that voter is the newer disk and this one is parked: adding it back would make a
    voter of a directory no process serves. The leader lists it until its fetch state expires.
    (While a replacement is under way it is the other way round: the new directory fetches as an
    observer, the old voter is silent, and the observer is the one to add.)"""
    fetched = observer.last_fetch_ms
    return any(voter.key.id == observer.key.id
               and voter.key.directory_id != observer.key.directory_id
               and voter.last_fetch_ms is not None
               and (fetched is None or voter.last_fetch_ms > fetched)
               for voter in voters)
