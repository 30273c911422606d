"""The key-value state machine, beneath the node: its operations and their encoding as records
(``ops``), the store they are applied to (``store``), what a snapshot of it holds and loading one
(``snapshot_data``), and the synchronous machine that applies the committed log to the store,
decides when to snapshot it, and loads snapshots of it (``machine``). The node, the simulator and
the backups all point down here; nothing here knows of a node, a file or a clock.
"""
