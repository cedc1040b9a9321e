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

{{/* etcd's passwords: the Secret values name, or the one the chart makes (templates/etcd-auth.yaml). */}}
{{- define "tf.etcdSecret" -}}{{ .Values.etcd.auth.existingSecret | default (printf "%s-etcd-auth" (include "tf.name" .)) }}{{- end -}}

{{/* The etcd login of `service` ("trainer", "lcm"), when etcd has authentication on. */}}
{{- define "tf.etcdLogin" -}}
{{- if .root.Values.etcd.auth.enabled }}
- {name: TF_ETCD_USER, value: {{ index .root.Values.etcd.auth (printf "%sUser" .service) | quote }}}
- name: TF_ETCD_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "tf.etcdSecret" .root }}, key: {{ .service }}-password}}
{{- end }}
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

{{/* The Secret holding the service token and the credentials key: the operator's, or the chart's own. */}}
{{- define "tf.serviceAuthSecret" -}}{{ .Values.serviceAuth.existingSecret | default (printf "%s-service-auth" (include "tf.name" .)) }}{{- end -}}

{{/* The service token every caller of the Trainer's and the LCM's gRPC presents (API, Trainer, LCM pods only). */}}
{{- define "tf.serviceTokenEnv" -}}
- name: TF_SERVICE_TOKEN
  valueFrom: {secretKeyRef: {name: {{ include "tf.serviceAuthSecret" . }}, key: {{ .Values.serviceAuth.serviceTokenKey }}}}
{{- end -}}

{{/* The key each job's own credentials are derived from (API, Trainer and LCM pods only). */}}
{{- define "tf.credentialsKeyEnv" -}}
- name: TF_CREDENTIALS_KEY
  valueFrom: {secretKeyRef: {name: {{ include "tf.serviceAuthSecret" . }}, key: {{ .Values.serviceAuth.credentialsKeyKey }}}}
{{- end -}}

{{/* Pod annotations: with the chart's own service token, new on every upgrade, the pods roll to take it. */}}
{{- define "tf.serviceAuthAnnotations" -}}
{{- if not .Values.serviceAuth.existingSecret }}
annotations:
  trainforge.io/service-auth-revision: {{ .Release.Revision | quote }}
{{- end }}
{{- end -}}
