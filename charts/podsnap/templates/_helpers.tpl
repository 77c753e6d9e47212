{{/*
podsnap.init fills keys missing from .Values; every template includes it first, then reads .Values as
usual. Idempotent. A key is missing, or null, for one of two reasons:
- `helm upgrade --reuse-values` renders a new chart with the previous release's values in place of
  the chart's values.yaml, so a key added in a later chart version is missing: it gets its default
  (templates/_defaults.tpl, generated from values.yaml), lists and maps included;
- the user set it to null, Helm's only way to clear a default map. Helm deletes such a key, except
  that `--reuse-values` may feed the stored null back as a null. A list or map the user removed
  stays empty; a removed scalar gets its default.
A list or map with a non-empty default tells the two apart by its "witnesses" (podsnap.removable):
keys that came into values.yaml with it. When a witness is there (looked up before anything is
filled), the release's chart had the key, so the user removed it.
Keys the user set (false, "" and 0 included) are never replaced, and a list or map the user set is
taken whole: a node selector, resources or affinity is the user's, never merged into.
*/}}
{{- define "podsnap.init" -}}
{{- $chartHad := dict -}}
{{- range $path, $witnesses := include "podsnap.removable" . | fromYaml -}}
{{- $had := false -}}
{{- range $witness := $witnesses -}}
{{- if eq (include "podsnap.hasValue" (dict "values" $.Values "path" $witness)) "true" -}}{{- $had = true -}}{{- end -}}
{{- end -}}
{{- $_ := set $chartHad $path $had -}}
{{- end -}}
{{- include "podsnap.fill" (dict "dst" .Values "prefix" "" "src" (include "podsnap.defaults" . | fromYaml) "chartHad" $chartHad) -}}
{{- end }}

{{- define "podsnap.fill" -}}
{{- $dst := .dst -}}
{{- $chartHad := .chartHad -}}
{{- range $key, $default := .src -}}
{{- $path := ternary $key (printf "%s.%s" $.prefix $key) (eq $.prefix "") -}}
{{- $missing := not (hasKey $dst $key) -}}
{{- $null := and (not $missing) (kindIs "invalid" (get $dst $key)) -}}
{{- if hasKey $chartHad $path -}}
{{- if or $null (and $missing (get $chartHad $path)) -}}
{{- $_ := set $dst $key (ternary list dict (kindIs "slice" $default)) -}}
{{- else if $missing -}}
{{- $_ := set $dst $key (deepCopy $default) -}}
{{- end -}}
{{- else if kindIs "map" $default -}}
{{- if not (kindIs "map" (get $dst $key)) -}}{{- $_ := set $dst $key dict -}}{{- end -}}
{{- include "podsnap.fill" (dict "dst" (get $dst $key) "prefix" $path "src" $default "chartHad" $chartHad) -}}
{{- else if or $missing $null -}}
{{- $_ := set $dst $key (deepCopy $default) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* podsnap.hasValue: "true" when the dotted path is in the values and not null. */}}
{{- define "podsnap.hasValue" -}}
{{- $node := .values -}}
{{- $found := true -}}
{{- range $part := splitList "." .path -}}
{{- if and $found (kindIs "map" $node) (hasKey $node $part) -}}
{{- $node = get $node $part -}}
{{- else -}}
{{- $found = false -}}
{{- end -}}
{{- end -}}
{{- and $found (not (kindIs "invalid" $node)) -}}
{{- end }}

{{/* The chart name, cut to 63 characters. */}}
{{- define "podsnap.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The base name of every object, cut to 45 characters so that the longest suffix the chart appends
("-operator-metrics", 17 characters) still fits in 63.
*/}}
{{- define "podsnap.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "podsnap.operator.fullname" -}}
{{- printf "%s-operator" (include "podsnap.fullname" .) }}
{{- end }}

{{- define "podsnap.agent.fullname" -}}
{{- printf "%s-agent" (include "podsnap.fullname" .) }}
{{- end }}

{{- define "podsnap.webhook.fullname" -}}
{{- printf "%s-webhook" (include "podsnap.fullname" .) }}
{{- end }}

{{- define "podsnap.tokenKey.secretName" -}}
{{- printf "%s-token-key" (include "podsnap.fullname" .) }}
{{- end }}

{{- define "podsnap.webhook.secretName" -}}
{{- printf "%s-webhook-tls" (include "podsnap.fullname" .) }}
{{- end }}

{{- define "podsnap.seccomp.fullname" -}}
{{- printf "%s-seccomp" (include "podsnap.fullname" .) }}
{{- end }}

{{- define "podsnap.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
podsnap.selectorLabels: only labels that never change for the life of a release, since a
Deployment's or DaemonSet's selector is immutable. Takes (dict "ctx" $ "component" "operator").
*/}}
{{- define "podsnap.selectorLabels" -}}
{{- if not (and .ctx .component) }}
{{- fail "podsnap.selectorLabels needs (dict \"ctx\" $ \"component\" NAME)" }}
{{- end -}}
app.kubernetes.io/name: {{ include "podsnap.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* podsnap.labels: selector labels plus version labels and commonLabels; metadata only. */}}
{{- define "podsnap.labels" -}}
{{ include "podsnap.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: podsnap
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ include "podsnap.chart" .ctx }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "podsnap.crdLabels" -}}
{{ include "podsnap.labels" (dict "ctx" . "component" "crds") }}
{{- end }}

{{/*
podsnap.image: registry/repository[:tag|@digest] of a component. Takes
(dict "ctx" $ "image" .Values.<component>.image).
*/}}
{{- define "podsnap.image" -}}
{{- $image := .image | default dict }}
{{- if not $image.repository }}
{{- fail "image.repository of a component is empty: set operator.image.repository / agent.image.repository" }}
{{- end }}
{{- $registry := .ctx.Values.image.registry | default "" }}
{{- $ref := ternary (printf "%s/%s" $registry $image.repository) $image.repository (ne $registry "") }}
{{- if $image.digest }}
{{- printf "%s@%s" $ref $image.digest }}
{{- else }}
{{- printf "%s:%s" $ref (toString (default (default .ctx.Chart.AppVersion .ctx.Values.image.tag) $image.tag)) }}
{{- end }}
{{- end }}

{{- define "podsnap.imagePullPolicy" -}}
{{- default .ctx.Values.image.pullPolicy .image.pullPolicy }}
{{- end }}

{{- define "podsnap.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "podsnap.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "podsnap.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "podsnap.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
podsnap.placementActive: "true" when placement is on, else empty. Placement needs the webhook: the pod
webhook gives restore pods their node affinity, and the validating webhook holds each agent to its own
Node's placement labels. Without it the agents would get the right to patch any Node, unchecked, for
labels nothing reads.
*/}}
{{- define "podsnap.placementActive" -}}
{{- if and .Values.placement.enabled .Values.webhook.enabled }}true{{ end -}}
{{- end }}

{{/* The artifact claim the agent mounts: the existing claim, or the one the chart creates. */}}
{{- define "podsnap.artifactClaimName" -}}
{{- $pvc := .Values.storage.pvc }}
{{- if $pvc.existingClaim }}
{{- $pvc.existingClaim }}
{{- else }}
{{- default (printf "%s-artifacts" (include "podsnap.fullname" .)) $pvc.name }}
{{- end }}
{{- end }}

{{/*
podsnap.validate fails on values that contradict each other (the schema checks each value alone).
*/}}
{{- define "podsnap.validate" -}}
{{- $pvc := .Values.storage.pvc }}
{{- /* only against a cluster: `helm template` and lint cannot look anything up and render bare names */}}
{{- if and (not .Values.image.registry) (lookup "v1" "Namespace" "" "kube-system") }}
{{- fail "image.registry is empty, and podsnap publishes no images: build them (make images), push them to your registry (make images-push REGISTRY=registry.example.com/podsnap) and set image.registry to that REGISTRY and image.tag to the tag it printed; image.registry=localhost for images imported into the nodes' runtime" }}
{{- end }}
{{- if and $pvc.create $pvc.existingClaim }}
{{- fail "storage.pvc.existingClaim is set, so the chart must not create a claim: also set storage.pvc.create=false" }}
{{- end }}
{{- if not (or $pvc.create $pvc.existingClaim) }}
{{- fail "storage.pvc.create is false but storage.pvc.existingClaim is empty: the agent needs an artifact claim; set one of them" }}
{{- end }}
{{- if and $pvc.create (not $pvc.accessModes) }}
{{- fail "storage.pvc.accessModes is empty, and a claim needs at least one access mode: set e.g. storage.pvc.accessModes={ReadWriteMany}" }}
{{- end }}
{{- if and $pvc.existingClaim $pvc.name }}
{{- fail "storage.pvc.name names a claim the chart would create, but storage.pvc.existingClaim is set: unset storage.pvc.name" }}
{{- end }}
{{- $annotations := dict "operator.podAnnotations" .Values.operator.podAnnotations "agent.podAnnotations" .Values.agent.podAnnotations "operator.serviceAccount.annotations" .Values.operator.serviceAccount.annotations "agent.serviceAccount.annotations" .Values.agent.serviceAccount.annotations "storage.pvc.annotations" $pvc.annotations }}
{{- range $key, $map := $annotations }}
{{- $size := 0 }}
{{- range $k, $v := $map }}{{ $size = add $size (len $k) (len (toString ($v | default ""))) }}{{ end }}
{{- if gt (int $size) 262144 }}
{{- fail (printf "%s: %d bytes of annotations, more than the 256 KiB Kubernetes allows an object: shorten them" $key $size) }}
{{- end }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled=true (the ServiceMonitor scrapes the metrics Services)" }}
{{- end }}
{{- if and .Values.webhook.certManager.enabled (not .Values.webhook.enabled) }}
{{- fail "webhook.certManager.enabled needs webhook.enabled=true: there is no webhook to issue a certificate for" }}
{{- end }}
{{- $strategy := .Values.agent.updateStrategy | default dict }}
{{- if eq ($strategy.type | default "RollingUpdate") "RollingUpdate" }}
{{- $surge := (($strategy.rollingUpdate | default dict).maxSurge) | default 0 }}
{{- /* a percentage is rounded up to whole pods, so any non-zero one surges */}}
{{- if ne (atoi (toString $surge | trimSuffix "%")) 0 }}
{{- fail (printf "agent.updateStrategy.rollingUpdate.maxSurge is %v, and it must be 0 (unset): a surge runs the new agent beside the old one on a node, and the new one's startup recovery would act on a capture the old one is still dumping (it gives the source its CUDA state back mid-dump); unset it and roll with agent.updateStrategy.rollingUpdate.maxUnavailable" $surge) }}
{{- end }}
{{- end }}
{{- if ne (int .Values.operator.replicas) 1 }}
{{- fail "operator.replicas must be 1: the operator runs kopf standalone, without peering" }}
{{- end }}
{{- if eq (int .Values.webhook.port) (int .Values.metrics.port) }}
{{- fail "webhook.port and metrics.port are the same port of the operator container: change one" }}
{{- end }}
{{- if eq (int .Values.operator.healthPort) (int .Values.metrics.port) }}
{{- fail "operator.healthPort and metrics.port are the same port: change one" }}
{{- end }}
{{- if eq (int .Values.agent.healthPort) (int .Values.metrics.port) }}
{{- fail "agent.healthPort and metrics.port are the same port: change one" }}
{{- end }}
{{- end }}

{{/*
podsnap.webhook.tls: the self-signed CA and serving certificate of the webhook, as a dict of
base64 Secret data (ca.crt, tls.crt, tls.key), in YAML. Made ONCE: an existing Secret of the
release (found with `lookup`) is reused, so upgrades, `--reuse-values` included, keep the
certificate. Within one render the result is cached in .Values so the Secret and the webhook
configuration's caBundle agree. `helm template` cannot look up, so it makes a new pair each time.
*/}}
{{- define "podsnap.webhook.tls" -}}
{{- if not (hasKey .Values "__podsnapWebhookTLS") }}
{{- $secretName := include "podsnap.webhook.secretName" . }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $secretName }}
{{- $data := dict }}
{{- if and $existing $existing.data }}
{{- if and (index $existing.data "ca.crt") (index $existing.data "tls.crt") (index $existing.data "tls.key") }}
{{- $data = pick $existing.data "ca.crt" "tls.crt" "tls.key" }}
{{- end }}
{{- end }}
{{- if not $data }}
{{- $svc := include "podsnap.webhook.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $altNames := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $ca := genCA (printf "%s-ca" $svc) 3650 }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $altNames 3650 $ca }}
{{- $data = dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) }}
{{- end }}
{{- $_ := set .Values "__podsnapWebhookTLS" $data }}
{{- end }}
{{- toYaml (get .Values "__podsnapWebhookTLS") }}
{{- end }}

{{/*
podsnap.compactMap: a string map without its null entries. A null removes a default key (Helm's way),
and `--reuse-values` stores that null in the release and feeds it back on the next upgrade, where Helm
no longer drops it: it must not reach the rendered object.
*/}}
{{- define "podsnap.compactMap" -}}
{{- $out := dict -}}
{{- range $k, $v := . -}}
{{- if not (kindIs "invalid" $v) -}}{{- $_ := set $out $k $v -}}{{- end -}}
{{- end -}}
{{- if $out -}}{{- toYaml $out -}}{{- end -}}
{{- end -}}
