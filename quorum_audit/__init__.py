"""The quorum audit pipeline on Spark: read replicas' logs and snapshots, prove they agree, chart
the quorum's history. See docs/audit.md."""
