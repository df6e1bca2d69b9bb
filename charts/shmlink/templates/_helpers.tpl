{{/* The chart's name, as the kustomize base names its objects. */}}
{{- define "shmlink.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object names: the release name when it holds the chart's name (release `shmlink`: the
names of deploy/base), else <release>-<name>. */}}
{{- define "shmlink.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "shmlink.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* What selects the agents' Pods (DaemonSet, Service, NetworkPolicy, ServiceMonitor). */}}
{{- define "shmlink.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shmlink.name" . }}
{{- end -}}

{{/* The labels of every object, as deploy/base's kustomization sets them. */}}
{{- define "shmlink.labels" -}}
{{ include "shmlink.selectorLabels" . }}
app.kubernetes.io/part-of: shmlink
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "shmlink.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "shmlink.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "shmlink.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The agent's capabilities: the base's (PERFMON unless the death trace is off) and what
     each enabled component adds. */}}
{{- define "shmlink.capabilities" -}}
{{- $caps := list "SYS_PTRACE" "DAC_READ_SEARCH" -}}
{{- if ne .Values.deathTrace.mode "off" }}{{ $caps = append $caps "PERFMON" }}{{ end -}}
{{- if .Values.kernelLog.enabled }}{{ $caps = append $caps "SYSLOG" }}{{ end -}}
{{- toYaml $caps -}}
{{- end -}}

{{/* The ServiceAccount every ClusterRoleBinding binds. */}}
{{- define "shmlink.subjects" -}}
- kind: ServiceAccount
  name: {{ include "shmlink.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* The admission webhook's object names: <fullname>-admission (release shmlink: the names of
deploy/components/admission). */}}
{{- define "shmlink.admission.name" -}}
{{- printf "%s-admission" (include "shmlink.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shmlink.admission.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shmlink.name" . }}-admission
{{- end -}}

{{/* The labels of the admission objects, as deploy/components/admission sets them. */}}
{{- define "shmlink.admission.labels" -}}
{{ include "shmlink.admission.selectorLabels" . }}
app.kubernetes.io/part-of: shmlink
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The Secret the webhook serves: cert-manager's Certificate's, else the one given. */}}
{{- define "shmlink.admission.secretName" -}}
{{- if .Values.admission.certManager.enabled -}}
{{- include "shmlink.admission.name" . }}-tls
{{- else -}}
{{- required "admission.tls.secretName: the Secret (tls.crt, tls.key) the webhook serves, needed with admission.certManager.enabled=false" .Values.admission.tls.secretName -}}
{{- end -}}
{{- end -}}
