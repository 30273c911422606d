"""The networked quorum node: runtime, transport, APIs."""
