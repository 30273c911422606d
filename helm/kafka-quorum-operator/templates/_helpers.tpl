{{- define "kqo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kqo.fullname" -}}
{{- if contains (include "kqo.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "kqo.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kqo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kqo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kqo.labels" -}}
{{ include "kqo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The operator pods' labels as k=v,... (the quorums' NetworkPolicies let them in). */}}
{{- define "kqo.podSelector" -}}
{{- printf "app.kubernetes.io/name=%s,app.kubernetes.io/instance=%s" (include "kqo.name" .) .Release.Name -}}
{{- end -}}

{{- define "kqo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kqo.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kqo.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* What the operator may do with the quorums it manages: nothing more. */}}
{{- /* The namespaces the operator manages (Role + RoleBinding in each): watchNamespaces, or
the release namespace alone; none with clusterWide (a ClusterRole instead). */ -}}
{{- define "kqo.namespaces" -}}
{{- if not .Values.clusterWide -}}
{{- toYaml (.Values.watchNamespaces | default (list .Release.Namespace)) -}}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/* Where the NOTES' example quorum and `helm test` go: the first namespace the operator
manages (the release's when it manages every namespace, or none is listed). */}}
{{- define "kqo.quorumNamespace" -}}
{{- if and (not .Values.clusterWide) .Values.watchNamespaces -}}
{{- first .Values.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{- define "kqo.workloadRules" -}}
- apiGroups: [kraft.quorum.dev]
  resources: [kafkaquorums]
  verbs: [get, list, watch, patch]
- apiGroups: [kraft.quorum.dev]
  resources: [kafkaquorums/status]
  verbs: [get, patch]
{{- /* What it owns names its KafkaQuorum with blockOwnerDeletion (foreground deletion waits
     for them): where OwnerReferencesPermissionEnforcement is on (OpenShift), setting that needs
     update on the owner's finalizers. */}}
- apiGroups: [kraft.quorum.dev]
  resources: [kafkaquorums/finalizers]
  verbs: [update]
{{- /* On-demand backups: owner references (metadata) and their status. The operator never
     deletes one, but where OwnerReferencesPermissionEnforcement is on (tests/kube runs with
     it), setting an owner reference needs delete on the object. */}}
- apiGroups: [kraft.quorum.dev]
  resources: [quorumbackups]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [kraft.quorum.dev]
  resources: [quorumbackups/status]
  verbs: [get, patch]
{{- /* Restore drills run as Jobs (spec.backup.restoreDrill); Kubernetes deletes them (TTL). */}}
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, create]
{{- /* Pods are patched for one label: kraft.quorum.dev/voter, which the PDB selects. */}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete]
{{- /* A rolling update's restarts go through the Eviction API: the budget counts them. */}}
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
{{- /* Claims grow with spec.storage.size (patch). */}}
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, create, patch, delete]
{{- /* One ConfigMap per pod revision: listed and deleted once no pod uses it. */}}
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, create, patch, delete]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [get, create, patch]
{{- /* A quorum of one or two voters has no budget: deleted when it shrinks to that. */}}
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
{{- /* The quorums' CA, certificates and tokens: created once, renewed; never listed. Also
     read: the object-store credentials that spec.backup and spec.bootstrap name. */}}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch]
{{- if .Values.certManager.enabled }}
- apiGroups: [cert-manager.io]
  resources: [certificates]
  verbs: [get, create, patch]
{{- end }}
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* "true" when the pods' fixed uid, gid and fsGroup are left out (openshift.adaptSecurityContext). */}}
{{- define "kqo.platformIds" -}}
{{- $mode := .Values.openshift.adaptSecurityContext -}}
{{- if or (eq $mode "force") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1")) -}}
true
{{- end -}}
{{- end -}}

{{/* A securityContext without the ids the platform assigns, when it does. */}}
{{- define "kqo.securityContext" -}}
{{- $context := index . 0 -}}
{{- if include "kqo.platformIds" (index . 1) -}}
{{- $context = omit $context "runAsUser" "runAsGroup" "fsGroup" -}}
{{- end -}}
{{- toYaml $context -}}
{{- end -}}
