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
{{- define "kqo.workloadRules" -}}
- apiGroups: [kraft.quorum.dev]
  resources: [kafkaquorums]
  verbs: [get, list, watch, patch]
- apiGroups: [kraft.quorum.dev]
  resources: [kafkaquorums/status]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [pods, persistentvolumeclaims]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [configmaps, services, serviceaccounts]
  verbs: [get, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
