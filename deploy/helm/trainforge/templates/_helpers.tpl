{{- define "tf.name" -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}{{- end -}}

{{- define "tf.labels" -}}
app.kubernetes.io/name: trainforge
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: trainforge
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tf.selector" -}}
app.kubernetes.io/name: trainforge
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tf.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}

{{- define "tf.trainerAddress" -}}{{ include "tf.name" . }}-trainer.{{ .Release.Namespace }}.svc:{{ .Values.trainer.port }}{{- end -}}
{{- define "tf.lcmAddress" -}}{{ include "tf.name" . }}-lcm.{{ .Release.Namespace }}.svc:{{ .Values.lcm.port }}{{- end -}}

{{- define "tf.storesSecret" -}}{{ include "tf.name" . }}-stores{{- end -}}

{{/* MongoDB's and the log store's connection strings, with their credentials, from a Secret: the one named in
     values or, without one, the chart's own (stores-secret.yaml). Only the API and the Trainer get them. */}}
{{- define "tf.storeEnv" -}}
- name: TF_MONGO_URL
  valueFrom: {secretKeyRef: {name: {{ .Values.mongo.existingSecret | default (include "tf.storesSecret" .) }}, key: {{ ternary .Values.mongo.secretKey "mongo-url" (ne .Values.mongo.existingSecret "") }}}}
- name: TF_LOGSTORE_URL
  valueFrom: {secretKeyRef: {name: {{ .Values.logstore.existingSecret | default (include "tf.storesSecret" .) }}, key: {{ ternary .Values.logstore.secretKey "logstore-url" (ne .Values.logstore.existingSecret "") }}}}
{{ include "tf.s3Env" . }}
{{- end -}}

{{/* The object store's keys (the LCM copies them into each team namespace's platform Secret). */}}
{{- define "tf.s3Env" -}}
- name: TF_S3_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ .Values.objectstore.existingSecret }}, key: {{ .Values.objectstore.accessKeyKey }}}}
- name: TF_S3_SECRET_KEY
  valueFrom: {secretKeyRef: {name: {{ .Values.objectstore.existingSecret }}, key: {{ .Values.objectstore.secretKeyKey }}}}
{{- end -}}

{{- define "tf.podSecurity" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
runAsGroup: {{ .Values.runAsUser }}
fsGroup: {{ .Values.runAsUser }}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "tf.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities: {drop: [ALL]}
{{- end -}}

{{/* Liveness/readiness of a gRPC service: the standard grpc.health.v1 service, natively or by command;
     `service` names one service ("" : the server as a whole). */}}
{{- define "tf.grpcProbe" -}}
{{- $service := .service | default "" }}
{{- if eq .root.Values.probes.mode "grpc" }}
grpc: {port: {{ .port }}{{ if $service }}, service: {{ $service }}{{ end }}}
{{- else }}
exec:
  command: [python3, -c, "import grpc,sys; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; c=grpc.insecure_channel('127.0.0.1:{{ .port }}'); sys.exit(0 if g.HealthStub(c).Check(h.HealthCheckRequest(service='{{ $service }}'), timeout=5).status == h.HealthCheckResponse.SERVING else 1)"]
{{- end }}
periodSeconds: {{ .root.Values.probes.periodSeconds }}
failureThreshold: {{ .root.Values.probes.failureThreshold }}
timeoutSeconds: 5
{{- end -}}
