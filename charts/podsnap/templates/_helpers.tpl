{{- define "podsnap.crdLabels" -}}
app.kubernetes.io/name: podsnap
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: crds
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
