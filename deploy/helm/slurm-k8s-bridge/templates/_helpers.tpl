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
{{- if and (eq .Values.slurm.backend "pyslurm") (not (include "bridge.slurmConfConfigMap" .)) -}}
{{- fail "the pyslurm backend needs slurm.conf: set slurm.slurmConf or slurm.existingSlurmConfConfigMap" -}}
{{- end -}}
{{- end -}}
