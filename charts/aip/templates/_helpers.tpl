{{/*
Names are fixed, not release-prefixed: the webhook configurations and the
ClusterRoles are cluster-wide and the operator finds its Service, Secret and
Lease by these names. Install the chart once per cluster.
*/}}
{{- define "aip.name" -}}aip-operator{{- end -}}

{{- define "aip.labels" -}}
app.kubernetes.io/name: aip-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: aip
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "aip.selector" -}}
app.kubernetes.io/name: aip-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "aip.image" -}}
{{- printf "%s:%s" .repository (default $.appVersion .tag) -}}
{{- end -}}

{{/* The operator's identity as the API server authenticates it. */}}
{{- define "aip.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:aip-operator
{{- end -}}

{{- define "aip.tlsSecret" -}}aip-operator-tls{{- end -}}

{{/* One webhook's client: the operator's Service at `path`. */}}
{{- define "aip.client" -}}
service:
  name: aip-operator
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path }}
  port: {{ .root.Values.service.webhookPort }}
{{- end -}}
