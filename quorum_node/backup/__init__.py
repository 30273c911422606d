"""Backups of a live node and restores into a new quorum (docs/backup.md): the format and its
manifest (``manifest``), where backups live (``store``), taking one inside the node
(``capture``, ``endpoint``) and writing it from outside (``writer``), and ``restore``."""
