"""A KRaft-style Raft metadata quorum node."""
