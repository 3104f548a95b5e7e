{{/* A prefill or decode worker: Deployment + headless Service.
Call with (dict "root" $ "component" "prefill" "values" .Values.prefill). */}}
{{- define "moesh.attentionWorker" -}}
{{- $root := .root -}}
{{- $fullname := include "moesh.fullname" $root -}}
{{- $name := printf "%s-%s" $fullname .component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels:
    {{- include "moesh.labels" . | nindent 4 }}
spec:
  replicas: {{ .values.replicas }}
  selector:
    matchLabels:
      {{- include "moesh.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "moesh.labels" . | nindent 8 }}
        {{- with $root.Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        {{- include "moesh.podAnnotations" . | nindent 8 }}
    spec:
      # A SIGTERM drains: nothing new is taken, what is in flight finishes
      # (--drain_timeout_s), then the process exits; the grace period covers it.
      terminationGracePeriodSeconds: {{ add (int $root.Values.drain.timeoutSeconds) (int $root.Values.drain.preStopSeconds) 10 }}
      serviceAccountName: {{ include "moesh.serviceAccountName" $root }}
      automountServiceAccountToken: false
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      {{- with include "moesh.initContainers" $root }}
      {{- . | trim | nindent 6 }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "moesh.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          lifecycle:
            # Before the SIGTERM: time for the Service's endpoints to drop the pod.
            preStop:
              sleep:
                seconds: {{ int $root.Values.drain.preStopSeconds }}
          args:
            - {{ .component }}
            - --flagfile=/etc/moesh/{{ .component }}.flags
            # The router and prefill workers reach this pod at its IP.
            - --advertise_host=$(POD_IP)
            {{- range .values.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            {{- include "moesh.env" . | nindent 12 }}
          ports:
            {{- include "moesh.ports" $root | nindent 12 }}
          {{- include "moesh.probes" (dict "root" $root "tls" (ne $root.Values.tls.secretName "")) | nindent 10 }}
          resources:
            {{- include "moesh.resources" . | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "moesh.volumeMounts" $root | nindent 12 }}
      volumes:
        {{- include "moesh.volumes" $root | nindent 8 }}
      {{- with include "moesh.scheduling" . }}
      {{- . | trim | nindent 6 }}
      {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  labels:
    {{- include "moesh.labels" . | nindent 4 }}
    moesh.io/scrape: "true"
spec:
  clusterIP: None
  selector:
    {{- include "moesh.selectorLabels" . | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $root.Values.ports.grpc }}
      targetPort: grpc
      protocol: TCP
    - name: metrics
      port: {{ $root.Values.ports.metrics }}
      targetPort: metrics
      protocol: TCP
{{- end }}
