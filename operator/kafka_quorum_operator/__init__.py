"""The KafkaQuorum operator: runs a quorum of ``quorum-node`` replicas on Kubernetes and replaces a
voter whose volume was lost the KIP-856 way (AddVoter of the new directory, then RemoveVoter of
the old one).

Layout: ``spec`` (the custom resource's spec, defaulted), ``observe`` (API objects, node metrics
and DescribeQuorum as plain values), ``plan`` (every decision, a pure function of what was
observed), ``status`` (conditions, status and the record of what was done), ``resources`` (the
Kubernetes objects the operator owns), ``certs`` (X.509), ``credentials`` (the quorum's
Secrets and when to renew them), ``keeper`` (keeps them, gives the operator its TLS context),
``kube`` and ``nodes`` (HTTP clients), ``reconcile`` (observe, plan, act), ``handlers`` (kopf,
thin), ``lease`` (single active operator).
"""

GROUP = "kraft.quorum.dev"
VERSION = "v1alpha1"
KIND = "KafkaQuorum"
PLURAL = "kafkaquorums"
API_VERSION = f"{GROUP}/{VERSION}"
# An on-demand backup of a KafkaQuorum (``ondemand``).
QB_KIND = "QuorumBackup"
QB_PLURAL = "quorumbackups"
# Labels and annotations the operator puts on what it creates.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NODE_ID = f"{GROUP}/node-id"
# "true" on the pods of the quorum's voters (kept by the operator as voters change): the
# PodDisruptionBudget selects these only.
LABEL_VOTER = f"{GROUP}/voter"
ANNOTATION_CONFIG_HASH = f"{GROUP}/config-hash"
ANNOTATION_CLUSTER_ID = f"{GROUP}/cluster-id"
# Whether a pod's client listener speaks TLS ("true"/"false"), as the operator created it: read
# rather than its probes' scheme, which a service mesh may rewrite (Istio's probe rewrite).
ANNOTATION_CLIENT_TLS = f"{GROUP}/client-tls"
# On a pod made in place of ones the kubelet rejected at admission: how many were, in a row (the
# replacement's back-off grows with it, and survives an operator restart on the pod itself).
ANNOTATION_REJECTIONS = f"{GROUP}/admission-rejections"
APP_NAME = "kafka-quorum"
MANAGER = "kafka-quorum-operator"

__version__ = "0.1.0"
