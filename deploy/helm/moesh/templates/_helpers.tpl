{{/* Names. */}}
{{- define "moesh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-moesh, or the release name when it already says moesh. Kept to 40
characters so that <fullname>-router-cluster and StatefulSet pod names fit 63. */}}
{{- define "moesh.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else if contains (include "moesh.name" .) .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "moesh.name" .) | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "moesh.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "moesh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "moesh.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "moesh.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Labels. Call with (dict "root" $ "component" "router"). */}}
{{- define "moesh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "moesh.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{- define "moesh.labels" -}}
helm.sh/chart: {{ include "moesh.chart" .root }}
{{ include "moesh.selectorLabels" . }}
app.kubernetes.io/part-of: moesh
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* Addresses. */}}
{{- define "moesh.routerClusterAddress" -}}
{{- printf "%s-router-cluster.%s.svc.%s:%d" (include "moesh.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.ports.internal) }}
{{- end }}

{{- define "moesh.routerAddress" -}}
{{- printf "%s-router.%s.svc.%s:%d" (include "moesh.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.ports.grpc) }}
{{- end }}

{{/* Comma-separated stable addresses of the expert workers (StatefulSet pods). */}}
{{- define "moesh.expertAddresses" -}}
{{- $fullname := include "moesh.fullname" . }}
{{- $addrs := list }}
{{- range $i := until (int .Values.expert.replicas) }}
{{- $addrs = append $addrs (printf "%s-expert-%d.%s-expert.%s.svc.%s:%d" $fullname $i $fullname $.Release.Namespace $.Values.clusterDomain (int $.Values.ports.grpc)) }}
{{- end }}
{{- join "," $addrs }}
{{- end }}

{{/* The --experts / --shard flag of expert worker i. Call with (dict "root" $ "i" i). */}}
{{- define "moesh.expertPlacementFlag" -}}
{{- $p := .root.Values.expert.placement }}
{{- if eq $p.mode "shard" }}
{{- printf "--shard=%d/%d" (int .i) (int .root.Values.expert.replicas) }}
{{- else }}
{{- printf "--experts=%s" (index $p.experts (int .i)) }}
{{- end }}
{{- end }}

{{/* Pod-level pieces shared by every workload. Call with (dict "root" $ "component" "router" "values" .Values.router). */}}
{{- define "moesh.podAnnotations" -}}
checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
{{- if .root.Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .root.Values.ports.metrics | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .root.Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "moesh.scheduling" -}}
{{- with (default .root.Values.nodeSelector .values.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default .root.Values.tolerations .values.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default .root.Values.affinity .values.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Container resources with the GPU request (requests == limits for extended resources). */}}
{{- define "moesh.resources" -}}
{{- $r := deepCopy (default dict .values.resources) }}
{{- if gt (int .values.gpus) 0 }}
{{- $_ := set $r "requests" (merge (dict .root.Values.gpu.resourceName (toString .values.gpus)) (default dict $r.requests)) }}
{{- $_ := set $r "limits" (merge (dict .root.Values.gpu.resourceName (toString .values.gpus)) (default dict $r.limits)) }}
{{- end }}
{{- toYaml $r }}
{{- end }}

{{/* Env every container gets: its pod's name, namespace and IP (for --advertise_host). */}}
{{- define "moesh.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- with .root.Values.env }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The internal plane's mutual TLS flags (tls.secretName), one a line. */}}
{{- define "moesh.tlsFlags" -}}
{{- if .Values.tls.secretName }}
--tls_cert=/etc/moesh-tls/tls.crt
--tls_key=/etc/moesh-tls/tls.key
--tls_ca=/etc/moesh-tls/ca.crt
{{- end }}
{{- end }}

{{/* grpc.health.v1 probes; TCP ones on a TLS port (the kubelet has no
certificate). Call with (dict "root" $ "readinessService" "..." "tls" BOOL). */}}
{{- define "moesh.probes" -}}
{{- $p := .root.Values.probes -}}
{{- $check := dict "grpc" (dict "port" .root.Values.ports.grpc) -}}
{{- if .tls }}
{{- $check = dict "tcpSocket" (dict "port" .root.Values.ports.grpc) -}}
{{- end -}}
startupProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: {{ $p.startup.periodSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
livenessProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
readinessProbe:
  {{- if .tls }}
  {{- toYaml $check | nindent 2 }}
  {{- else }}
  grpc:
    port: {{ .root.Values.ports.grpc }}
    {{- with .readinessService }}
    service: {{ . }}
    {{- end }}
  {{- end }}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
{{- end }}

{{- define "moesh.ports" -}}
- name: grpc
  containerPort: {{ .Values.ports.grpc }}
  protocol: TCP
- name: metrics
  containerPort: {{ .Values.ports.metrics }}
  protocol: TCP
{{- end }}

{{/* Volumes: the model, the flagfiles, a writable /tmp. */}}
{{- define "moesh.volumes" -}}
- name: model
  {{- if eq .Values.model.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.pvc.claimName }}
    readOnly: true
  {{- else if eq .Values.model.source "hostPath" }}
  hostPath:
    path: {{ .Values.model.hostPath.path }}
    type: {{ .Values.model.hostPath.type }}
  {{- else }}
  emptyDir: {}
  {{- end }}
- name: config
  configMap:
    name: {{ include "moesh.fullname" . }}
- name: tmp
  emptyDir: {}
{{- with .Values.tls.secretName }}
- name: tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{- define "moesh.volumeMounts" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
  {{- with .Values.model.pvc.subPath }}
  {{- if eq $.Values.model.source "pvc" }}
  subPath: {{ . }}
  {{- end }}
  {{- end }}
- name: config
  mountPath: /etc/moesh
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.secretName }}
- name: tls
  mountPath: /etc/moesh-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* With model.source=generate: an init container that writes a random model. */}}
{{- define "moesh.initContainers" -}}
{{- if eq .Values.model.source "generate" }}
initContainers:
  - name: mkmodel
    image: {{ include "moesh.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    args:
      - moesh
      - mkmodel
      - --family={{ .Values.model.generate.family }}
      - --preset={{ .Values.model.generate.preset }}
      - --seed={{ .Values.model.generate.seed }}
      - --out={{ .Values.model.path }}
    securityContext:
      {{- toYaml .Values.securityContext | nindent 6 }}
    volumeMounts:
      - name: model
        mountPath: {{ .Values.model.mountPath }}
{{- end }}
{{- end }}

{{/* The Secret holding the router's API keys: router.apiKeys.secretName, else the
chart's own <fullname>-api-keys (templates/api-keys.yaml); empty when the keys are off. */}}
{{- define "moesh.apiKeysSecret" -}}
{{- if .Values.router.apiKeys.enabled -}}
{{- .Values.router.apiKeys.secretName | default (printf "%s-api-keys" (include "moesh.fullname" .)) -}}
{{- end -}}
{{- end }}
