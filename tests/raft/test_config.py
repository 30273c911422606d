from __future__ import annotations

import pytest
from pydantic import ValidationError

from quorum_node.raft.config import QuorumConfig, VoterEndpoint, parse_quorum_voters


def test_kafka_defaults_but_a_fetch_timeout_of_etcds_election_timeout() -> None:
    config = QuorumConfig()
    assert (config.election_timeout_ms, config.fetch_timeout_ms, config.request_timeout_ms) == (
        1000, 1000, 2000)
    assert (config.retry_backoff_ms, config.append_linger_ms) == (20, 25)
    assert (config.check_quorum_timeout_ms, config.begin_quorum_interval_ms) == (1500, 500)
    # An idle leader answers four times a fetch timeout: a follower misses three answers first.
    assert config.long_poll_ms == 250
    assert QuorumConfig(fetch_timeout_ms=2000).long_poll_ms == 500  # Kafka's, at its timeout


def test_long_poll_must_fit_in_the_request_timeout() -> None:
    with pytest.raises(ValidationError, match="fetch_max_wait_ms must be below"):
        QuorumConfig(request_timeout_ms=500, fetch_max_wait_ms=500)


def test_parse_quorum_voters() -> None:
    assert parse_quorum_voters("1@localhost:9093, 2@10.0.0.2:9094,3@[::1]:9095") == (
        VoterEndpoint(id=1, host="localhost", port=9093),
        VoterEndpoint(id=2, host="10.0.0.2", port=9094),
        VoterEndpoint(id=3, host="::1", port=9095),
    )
    assert str(VoterEndpoint(id=3, host="::1", port=9095)) == "3@[::1]:9095"


@pytest.mark.parametrize(("value", "message"), [
    ("", "is empty"),
    (" , ", "is empty"),
    ("1@host", "'1@host' is not of the form id@host:port"),
    ("host:9093", "is not of the form"),
    ("x@host:9093", "is not of the form"),
    ("-1@host:9093", "is not of the form"),
    ("1@:9093", "is not of the form"),
    ("1@host:0", "'1@host:0': port: Input should be greater than or equal to 1$"),
    ("1@host:70000", "less than or equal to 65535"),
    ("1@a:1,1@b:2", "node id 1 appears twice"),
])
def test_bad_voter_lists_name_the_entry(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_quorum_voters(value)
