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
The namespaces the operator serves, as a JSON list (use with fromJsonArray): watchNamespaces, which
must be given (no namespace is served by default, the operator's own least of all: whoever may
create pipelines in a namespace may create pods there). Empty with clusterWide: every namespace.
*/}}
{{- define "eop.watchedNamespaces" -}}
{{- if .Values.clusterWide }}
{{- if .Values.watchNamespaces }}
{{- fail "watchNamespaces must be empty with clusterWide: true (the operator then serves every namespace)" }}
{{- end }}
{{- toJson list }}
{{- else }}
{{- if not .Values.watchNamespaces }}
{{- fail "watchNamespaces: list the namespaces whose pipelines the operator serves, e.g. --set 'watchNamespaces={team-a}' (the pipelines' own namespaces, not the operator's), or set clusterWide: true" }}
{{- end }}
{{- toJson .Values.watchNamespaces }}
{{- end }}
{{- end }}

{{/* The role the drivers' ServiceAccounts are bound to: a Role in each watched namespace, or
one ClusterRole (bound per namespace, by RoleBindings the operator creates) in clusterWide mode. */}}
{{- define "eop.driverRoleName" -}}
{{- printf "%s-driver" (include "eop.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "eop.driverRoleKind" -}}
{{- ternary "ClusterRole" "Role" .Values.clusterWide }}
{{- end }}

{{/*
What a pipeline's driver may do in its own namespace when it runs Spark executors on Kubernetes
(spec.spark.master k8s://...): manage its executor pods, their services and config map; no volume
claims. Nothing cluster-wide, no secrets; templates/driver-policy.yaml narrows it to the driver's
own pipeline. The same list as DRIVER_RULES in operator/eop_operator/render/rbac.py (tests/charts
checks they agree).
*/}}
{{- define "eop.driverRules" -}}
- apiGroups: [""]
  resources: ["pods", "services", "configmaps"]
  verbs: ["create", "get", "list", "watch", "delete", "deletecollection"]
{{- end }}

{{/*
RBAC: what the operator may do in each namespace it serves. The one list that both the
ClusterRole (clusterWide) and the per-namespace Roles are rendered from; why each rule exists is
in docs/install.md. Secrets: `get` (never list or watch), so the checks before a driver starts
and the health checks can read the Secrets a pipeline names (docs/observability.md;
rbac.readSecrets=false drops it), and
`create`, for the Spark RPC key of pipelines with executors on Kubernetes (limited by the
chart's ValidatingAdmissionPolicy, templates/secret-policy.yaml). No wildcards, no escalate or
impersonate, and `bind` only on the drivers' role, by name: the operator hands drivers that
pre-made role instead of holding (and granting) its permissions.
*/}}
{{/* Namespaced mode: the ClusterRole (bound by a RoleBinding in each served namespace only) that
lets the operator keep and release the finalizer on its own Role and RoleBindings there, so a
namespace's deletion cannot take its rights before its pipelines (docs/security.md, "Deleting a
namespace"). A ClusterRole, which no namespace's deletion removes: releasing the last finalizer
needs rights that outlive the namespace's Role. */}}
{{- define "eop.guardName" -}}
{{- printf "%s-guard" (include "eop.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "eop.guardRules" -}}
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles"]
  verbs: ["get", "patch"]
  resourceNames: [{{ include "eop.fullname" . | quote }}]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["get", "patch"]
  resourceNames: [{{ include "eop.fullname" . | quote }}, {{ include "eop.guardName" . | quote }}]
{{- end }}

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
  resources: ["configmaps", "persistentvolumeclaims", "services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# A driver's RoleBinding may name only the drivers' pre-made role (RBAC's escalation check).
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: [{{ ternary "clusterroles" "roles" .Values.clusterWide | quote }}]
  verbs: ["bind"]
  resourceNames: [{{ include "eop.driverRoleName" . | quote }}]
# retention Delete of a checkpoint in object storage: a Job with the pipeline's image and its
# object-store Secret deletes the objects (the operator never holds those credentials); created
# and read by name, owned by the pipeline (the garbage collector deletes it).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "create"]
# Driver pods: watched, and deleted to restart a stalled driver (its StatefulSet makes them).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
# Events on the pipelines (kopf posts core/v1 Events; events.k8s.io for newer clients); the
# Warning events of driver pods, claims and StatefulSets are listed for the status' reasons.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list", "create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Secrets: get (the Secrets a pipeline names, for the checks before a driver starts and the
# health checks; never list or watch) and create (the RPC key of a pipeline with executors on
# Kubernetes: created once, never read, updated or deleted; the garbage collector removes it
# with its pipeline). Create cannot be
# narrowed to names by RBAC: the chart's ValidatingAdmissionPolicy narrows it to Opaque Secrets
# named <pipeline>-spark-rpc, so the operator cannot mint service-account tokens with it.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: [{{ if .Values.rbac.readSecrets }}"get", {{ end }}"create"]
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
