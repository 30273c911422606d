"""The key-value state machine, beneath the node: the store and its operations' encoding
(``store``) and the synchronous machine that applies the committed log to it, snapshots it and
loads snapshots of it (``machine``). The node, the simulator and the backups all point down
here; nothing here knows of a node, a file or a clock.
"""
