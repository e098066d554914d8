{{/* Names: <release>-<chart> trimmed to 63 characters, or <release> when it already holds the chart name. */}}
{{- define "palomino.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "palomino.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "palomino.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* One image per service: <image.repository>-<service>:<tag> (services/torch.Dockerfile or plain.Dockerfile, --build-arg SERVICE=<service>). */}}
{{- define "palomino.tag" -}}
{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{- define "palomino.secret" -}}
{{- default (printf "%s-credentials" (include "palomino.fullname" .)) .Values.credentials.existingSecret -}}
{{- end -}}

{{/* Where the services are, from the Secret (URLs carry credentials) and the orchestrator's Service. */}}
{{- define "palomino.env" -}}
- name: PALOMINO_BROKER_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "palomino.secret" . }}
      key: broker-url
- name: PALOMINO_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "palomino.secret" . }}
      key: redis-url
- name: PALOMINO_ORCHESTRATOR_URL
  value: {{ printf "http://%s-orchestrator:%v" (include "palomino.fullname" .) .Values.orchestrator.port | quote }}
- name: PALOMINO_DATA_ROOTS  # a submitted data.dir must be in the datasets volume
  value: /data/datasets
{{- end -}}

{{/* The orchestrator's API token: for the orchestrator and its clients (dashboard, experiment job) only. */}}
{{- define "palomino.tokenEnv" -}}
- name: PALOMINO_ORCHESTRATOR_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "palomino.secret" . }}
      key: orchestrator-token
{{- end -}}

{{/* The key that signs messages between the orchestrator, cells and scorers (not the dashboard's).
     Optional in an existingSecret that predates it: the services then run unsigned. */}}
{{- define "palomino.messageKeyEnv" -}}
- name: PALOMINO_MESSAGE_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "palomino.secret" . }}
      key: message-key
      optional: true
{{- end -}}

{{- define "palomino.podSpecCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{- define "palomino.datasetsVolume" -}}
- name: datasets
{{- if .Values.datasets.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.datasets.existingClaim }}
{{- else if .Values.datasets.hostPath }}
  hostPath:
    path: {{ .Values.datasets.hostPath }}
    type: Directory
{{- else }}
  emptyDir: {}
{{- end }}
{{- end -}}

{{- define "palomino.runsClaim" -}}
{{- default (printf "%s-runs" (include "palomino.fullname" .)) .Values.runs.existingClaim -}}
{{- end -}}

{{/* With a ReadWriteOnce runs volume, pods that mount it must share the orchestrator's node. */}}
{{- define "palomino.runsAffinity" -}}
{{- if eq .Values.runs.accessMode "ReadWriteOnce" }}
affinity:
  podAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "palomino.selector" . | nindent 12 }}
            app.kubernetes.io/component: orchestrator
{{- end }}
{{- end -}}
