{{/* Names and labels. */}}

{{- define "eop.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the release name, prefixed with the chart name unless it has it. */}}
{{- define "eop.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "eop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "eop.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "eop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "eop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "eop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Images. */}}

{{- define "eop.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "eop.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "eop.imageTag" .) }}
{{- end }}

{{/* The Spark image: the value, else eop-spark beside the operator image, same tag. */}}
{{- define "eop.defaultPipelineImage" -}}
{{- if .Values.defaultPipelineImage }}
{{- .Values.defaultPipelineImage }}
{{- else }}
{{- $repo := .Values.image.repository }}
{{- $prefix := ternary (printf "%s/" (dir $repo)) "" (contains "/" $repo) }}
{{- printf "%seop-spark:%s" $prefix (include "eop.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
RBAC: what the operator may do in each namespace it serves. The one list that both the
ClusterRole (watchNamespaces empty) and the per-namespace Roles are rendered from; why each
rule exists is in docs/install.md. Secrets: `get` only (never list or watch), so the health
checks can read the Kafka Secret a pipeline names (docs/observability.md); rbac.readSecrets=false
drops it. No wildcards, no escalate/bind/impersonate.
*/}}
{{- define "eop.rbacRules" -}}
# The pipelines: watch them, add and remove the finalizer (patch), write their status.
- apiGroups: ["exactlyonce.io"]
  resources: ["exactlyoncepipelines"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["exactlyonce.io"]
  resources: ["exactlyoncepipelines/status"]
  verbs: ["get", "patch", "update"]
# What each pipeline is rendered into, applied server-side (create + patch), read and deleted.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Also what the drivers' Role grants when executors run on Kubernetes: RBAC lets the operator
# grant only permissions it holds itself (it has no escalate or bind).
- apiGroups: [""]
  resources: ["configmaps", "persistentvolumeclaims", "services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete", "deletecollection"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "deletecollection"]
# Events on the pipelines (kopf posts core/v1 Events; events.k8s.io for newer clients).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.rbac.readSecrets }}
# Health checks read the Kafka client Secret a pipeline references, by name: get, no list/watch.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/* Leader election: leases in the release's namespace only (never cluster-wide, where update
would reach other controllers' leases). */}}
{{- define "eop.leaderElectionRules" -}}
# Renewals are merge patches that carry the read resourceVersion (a conflict fails them).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "patch"]
{{- end }}

{{/* The subject every binding grants to: the operator's ServiceAccount. */}}
{{- define "eop.subjects" -}}
- kind: ServiceAccount
  name: {{ include "eop.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}
