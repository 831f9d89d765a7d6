{{- define "lmperf.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lmperf.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "lmperf.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "lmperf.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "lmperf.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lmperf.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "lmperf.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "lmperf.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "lmperf.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lmperf.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- /*
One TOML value: strings quoted (Go quoting is valid TOML for the printable ASCII a config
holds), booleans as is, whole numbers as integers (values arrive as float64), others as floats.
*/}}
{{- define "lmperf.tomlValue" -}}
{{- if kindIs "string" . }}{{ quote . }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if and (kindIs "float64" .) (eq (float64 (int64 .)) .) }}{{ int64 . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}{{ . }}
{{- else }}{{ fail (printf "lmperf: config value %v is not a string, number or boolean" .) }}
{{- end }}
{{- end }}

{{- /* `key = value` lines of a flat map, keys sorted, no leading or trailing newline. */}}
{{- define "lmperf.tomlTable" -}}
{{- $lines := list }}
{{- range $k, $v := . }}
{{- $lines = append $lines (printf "%s = %s" $k (include "lmperf.tomlValue" $v)) }}
{{- end }}
{{- join "\n" $lines }}
{{- end }}

{{- /* OTEL_RESOURCE_ATTRIBUTES: the pod's namespace and DaemonSet, then the user's extras. */}}
{{- define "lmperf.resourceAttributes" -}}
{{- $attrs := list "k8s.namespace.name=$(K8S_NAMESPACE_NAME)" (printf "k8s.daemonset.name=%s" (include "lmperf.fullname" .)) }}
{{- range $k, $v := .Values.otlp.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%v" $k $v) }}
{{- end }}
{{- join "," $attrs }}
{{- end }}
