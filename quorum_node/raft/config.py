"""Timing configuration of the quorum, with Kafka's names and defaults (QuorumConfig), but for
the fetch timeout: 1000 ms, as etcd's election timeout, against Kafka's 2000 ms. A leader that
goes silent (paused, cut off) is lost after the fetch timeout whatever else the quorum does, and
etcd's followers start an election after 1000 ms; an idle leader answers a parked Fetch four times
a fetch timeout, so a follower still misses three answers before it campaigns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from quorum_node.addresses import host_port


class QuorumConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # controller.quorum.election.timeout.ms: each timer is uniform in [T, 2T).
    election_timeout_ms: int = Field(1000, ge=1)
    # controller.quorum.fetch.timeout.ms: follower -> Prospective; check-quorum is 1.5x;
    # BeginQuorumEpoch heartbeats every 0.5x. Kafka's default is 2000 (see above).
    fetch_timeout_ms: int = Field(1000, ge=2)
    # controller.quorum.election.backoff.max.ms: cap of the EndQuorumEpoch successor back-off.
    election_backoff_max_ms: int = Field(1000, ge=0)
    # controller.quorum.request.timeout.ms
    request_timeout_ms: int = Field(2000, ge=1)
    # controller.quorum.retry.backoff.ms
    retry_backoff_ms: int = Field(20, ge=0)
    # controller.quorum.append.linger.ms
    append_linger_ms: int = Field(25, ge=0)
    # How long the leader parks a Fetch with nothing to return (Kafka: 500 ms), at most a
    # quarter of the fetch timeout (long_poll_ms).
    fetch_max_wait_ms: int = Field(500, ge=0)
    # controller.quorum.high.watermark.linger.ms: how long a parked Fetch may wait for records
    # to carry along once the high watermark has moved. Kafka answers at once (0); a few ms
    # let a busy leader tell followers the new high watermark with the next records, which
    # halves the messages per commit. Commits never wait for it: only followers' knowledge does.
    high_watermark_linger_ms: int = Field(5, ge=0)
    # controller.quorum.leader.flush.delay.ms: how long a leader may leave a lone write (a batch
    # of one record) unflushed while the voters fetching from it (each within that long) are a
    # majority without it: they commit the record, and the leader's fsync is off the commit's
    # path (Raft's dissertation, 10.2.1). Records still uncommitted that long after their append
    # are flushed. With more voters parked than a commit needs beside the leader, a lone write
    # is flushed and sent to only that many at once, and to the others within this delay.
    # Kafka flushes at once, and answers every parked Fetch (0).
    leader_flush_delay_ms: int = Field(5, ge=0)
    fetch_max_bytes: int = Field(8 * 1024 * 1024, ge=1)
    max_batch_bytes: int = Field(8 * 1024 * 1024, ge=1)

    @model_validator(mode="after")
    def _long_poll_fits_in_request(self) -> QuorumConfig:
        if self.fetch_max_wait_ms >= self.request_timeout_ms:
            raise ValueError(
                "fetch_max_wait_ms must be below request_timeout_ms, or every idle fetch times out"
            )
        return self

    @property
    def long_poll_ms(self) -> int:
        """How long a Fetch may wait at the leader for records: fetch_max_wait_ms, and at most a
        quarter of the fetch timeout, so that an idle leader's answers reach its follower well
        inside the fetch timer: a leader that stalls (a slow disk, a starved CPU) for less than
        three quarters of the fetch timeout is not campaigned against. A fetch timeout shorter
        than the long poll would expire while the Fetch waits, against a live leader."""
        return min(self.fetch_max_wait_ms, self.fetch_timeout_ms // 4)

    @property
    def check_quorum_timeout_ms(self) -> int:
        return self.fetch_timeout_ms * 3 // 2

    @property
    def begin_quorum_interval_ms(self) -> int:
        return self.fetch_timeout_ms // 2


class VoterEndpoint(BaseModel):
    """One entry of ``controller.quorum.voters``: ``id@host:port``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int = Field(ge=0)
    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)

    def __str__(self) -> str:
        return f"{self.id}@{host_port(self.host, self.port)}"


def parse_quorum_voters(value: str) -> tuple[VoterEndpoint, ...]:
    """Parse Kafka's static voter list, ``1@host1:9093,2@[::1]:9093,...``.

    Raises ValueError naming the offending entry: an empty list, a malformed entry, a port out of
    range or a node id given twice."""
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    if not entries:
        raise ValueError("controller.quorum.voters is empty: expected id@host:port,...")
    voters: list[VoterEndpoint] = []
    for entry in entries:
        node_id, at, address = entry.partition("@")
        host, colon, port = address.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]  # an IPv6 literal
        if not (at and colon and node_id.strip().isdigit() and port.isdigit() and host):
            raise ValueError(f"controller.quorum.voters: {entry!r} is not of the form id@host:port")
        try:
            voters.append(VoterEndpoint(id=int(node_id), host=host, port=int(port)))
        except ValidationError as error:
            problem = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in error.errors())
            raise ValueError(f"controller.quorum.voters: {entry!r}: {problem}") from None
    ids = [voter.id for voter in voters]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"controller.quorum.voters: node id {duplicates[0]} appears twice")
    return tuple(voters)
