{{/* Names, labels and the values every template derives from (one place each). */}}

{{/* The release's base name: the release name, prefixed by the chart's unless it holds it. */}}
{{- define "bridge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels a selector matches: the daemon's pods of this release. */}}
{{- define "bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "bridge.labels" -}}
{{ include "bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "bridge.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The uid (and gid) both containers run as: SlurmUser's with pyslurm (slurmctld trusts the
uid in the munge credential), the image's unprivileged user with slurmrestd (the JWT carries
SlurmUser's rights). */}}
{{- define "bridge.runAs" -}}
{{- if eq .Values.slurm.backend "pyslurm" -}}
{{- required "slurm.slurmUserId: the pyslurm backend runs as SlurmUser's uid" .Values.slurm.slurmUserId | int -}}
{{- else -}}
{{- .Values.runAsUser | int -}}
{{- end -}}
{{- end -}}

{{/* Name of the cluster-scoped RBAC objects: the release namespace is in it, so that two
releases of the same name (one cluster each, in its own namespace) do not claim the same objects. */}}
{{- define "bridge.clusterScopedName" -}}
{{- printf "%s-%s-nodes" .Release.Namespace (include "bridge.fullname" .) | trunc 253 -}}
{{- end -}}

{{/* Names of the cluster-scoped objects for workloads.enabled: the RBAC for managed namespaces'
pods, and the admission policies (and their bindings) that hold those pods for Slurm. */}}
{{- define "bridge.workloadsName" -}}
{{- printf "%s-%s-workloads" .Release.Namespace (include "bridge.fullname" .) | trunc 253 -}}
{{- end -}}

{{/* The namespaces whose pods Slurm places: labelled managed, but never the bridge's own (its job
pods are placed by the daemon's own means, and its replicas must not wait for themselves). */}}
{{- define "bridge.managedNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - {key: slurm-k8s-bridge/managed, operator: In, values: ["true"]}
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ list .Values.jobNamespace.name .Release.Namespace | uniq | toJson }}
{{- end -}}

{{- define "bridge.jwtSecret" -}}
{{- .Values.secrets.jwt.existingSecret | default (printf "%s-jwt" (include "bridge.fullname" .)) -}}
{{- end -}}

{{- define "bridge.mungeSecret" -}}
{{- .Values.secrets.munge.existingSecret | default (printf "%s-munge" (include "bridge.fullname" .)) -}}
{{- end -}}

{{/* The ConfigMap with slurm.conf, or nothing when there is none. */}}
{{- define "bridge.slurmConfConfigMap" -}}
{{- if .Values.slurm.existingSlurmConfConfigMap -}}
{{- .Values.slurm.existingSlurmConfConfigMap -}}
{{- else if .Values.slurm.slurmConf -}}
{{- printf "%s-slurm-conf" (include "bridge.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Where the waiters reach the leader: the fixed cluster IP when there is one (no cluster DNS
needed on the slurmds' hosts), else the Service's DNS name. */}}
{{- define "bridge.waiterApiUrl" -}}
{{- if .Values.config.waiterApiUrl -}}
{{- .Values.config.waiterApiUrl -}}
{{- else if .Values.service.clusterIP -}}
{{- printf "http://%s:%v" .Values.service.clusterIP .Values.service.port -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%v" (include "bridge.fullname" .) .Release.Namespace .Values.service.port -}}
{{- end -}}
{{- end -}}

{{/* Refuse values that would install something broken; included by the Deployment. */}}
{{- define "bridge.validate" -}}
{{- if not (has .Values.slurm.backend (list "rest" "pyslurm")) -}}
{{- fail (printf "slurm.backend must be rest or pyslurm, not %q" .Values.slurm.backend) -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled: two daemons acting at once would run each job twice" -}}
{{- end -}}
{{- if eq .Release.Namespace .Values.jobNamespace.name -}}
{{- fail "install the chart in a namespace of its own, not the job namespace: its Secrets (JWT, munge key) would sit beside the jobs' pods and Secrets" -}}
{{- end -}}
{{- if has .Release.Namespace (list "default" "kube-system" "kube-public") -}}
{{- fail (printf "install the chart in a namespace of its own, not %q: the daemon may patch every pod of its namespace (the leader label)" .Release.Namespace) -}}
{{- end -}}
{{- if hasKey (.Values.podLabels | default dict) "slurm-k8s-bridge/role" -}}
{{- fail "podLabels must not set slurm-k8s-bridge/role: the leader sets it, and the Service selects by it" -}}
{{- end -}}
{{- range $key := list "extraTopLevel" "extraSlurm" "extraLeaderElection" "extraWaiter" "extraTables" -}}
{{- $text := index ($.Values.config | default dict) $key | default "" -}}
{{- if regexMatch "(?m)^\\s*(namespace|lease_name)\\s*=" $text -}}
{{- fail (printf "config.%s must not set namespace or lease_name: the job namespace and the Lease come from jobNamespace.name, so that the RBAC grants them" $key) -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.slurm.backend "pyslurm" -}}
{{- if not (regexMatch "^[1-9][0-9]*$" (toString .Values.slurm.slurmUserId)) -}}
{{- fail "slurm.slurmUserId must be SlurmUser's uid, a positive integer: the pods never run as root" -}}
{{- end -}}
{{- else if not (regexMatch "^[1-9][0-9]*$" (toString .Values.runAsUser)) -}}
{{- fail "runAsUser must be a positive integer: the pods never run as root" -}}
{{- end -}}
{{- if and (eq .Values.slurm.backend "pyslurm") (not (include "bridge.slurmConfConfigMap" .)) -}}
{{- fail "the pyslurm backend needs slurm.conf: set slurm.slurmConf or slurm.existingSlurmConfConfigMap" -}}
{{- end -}}
{{- end -}}
