"""Command-line tools: quorum-node, quorum-admin, quorum-client."""
