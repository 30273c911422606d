"""``kubectl kq``: a kubectl plugin for KafkaQuorums (installed as the ``kubectl-kq`` console
script, which kubectl finds on PATH).

Layout: ``views`` (what a quorum's status, pods and backups say, and whether a restart is safe:
pure functions of API objects), ``report`` (the support bundle), ``cli`` (argparse, the API
calls, exit codes). The API calls go through the operator's own client (``kafka_quorum_operator
.kube``), with a retry policy of the plugin's: nothing that creates is sent twice.
"""

# What an exit status means (docs/kubectl-kq.md); each has one prefix on stderr.
EXIT_OK = 0
EXIT_ERROR = 1  # the API server refused or failed, or the object is not there
EXIT_USAGE = 2  # bad arguments (argparse's own status)
EXIT_REFUSED = 3  # a safety check said no (restart), or the PodDisruptionBudget did (429)
EXIT_FAILED = 4  # what --wait followed ended badly (a QuorumBackup Failed)
EXIT_TIMEOUT = 5  # --wait ran out of time

PROG = "kubectl kq"
BACKUP_KIND = "QuorumBackup"
BACKUP_PLURAL = "quorumbackups"
# The label the chart puts on the operator's pods (the report collects their logs).
OPERATOR_SELECTOR = {"app.kubernetes.io/name": "kafka-quorum-operator"}
