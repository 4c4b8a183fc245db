{{/* Names, labels and the derived settings every template shares. */}}

{{- define "trainyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Kept short: KubeRay appends "-head-svc" and pod suffixes to the RayCluster name. */}}
{{- define "trainyard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trainyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trainyard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "trainyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "trainyard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainyard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "repository:tag", the tag defaulting to the chart's appVersion. Call with (list image $). */}}
{{- define "trainyard.image" -}}
{{- $img := index . 0 }}{{- $root := index . 1 }}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) }}
{{- end }}

{{/* "true" when the control plane runs on SQLite (no PostgreSQL URL given). */}}
{{- define "trainyard.sqlite" -}}
{{- if and (not .Values.database.url) (not .Values.database.existingSecret) }}true{{ end }}
{{- end }}

{{- define "trainyard.secretName" -}}
{{- include "trainyard.fullname" . }}
{{- end }}

{{- define "trainyard.rayAddress" -}}
{{- if .Values.ray.cluster.enabled }}
{{- printf "ray://%s-head-svc.%s.svc:10001" (include "trainyard.fullname" .) .Release.Namespace }}
{{- else }}
{{- .Values.ray.address }}
{{- end }}
{{- end }}

{{- define "trainyard.storageUri" -}}
{{- if .Values.storage.uri }}
{{- .Values.storage.uri }}
{{- else }}
{{- printf "file://%s/storage" .Values.storage.mountPath }}
{{- end }}
{{- end }}

{{- define "trainyard.storageClaim" -}}
{{- default (printf "%s-storage" (include "trainyard.fullname" .)) .Values.storage.persistence.existingClaim }}
{{- end }}

{{/* An object store (s3://, gs://) in storage.uri: no volume, credentials from storage.existingSecret. */}}
{{- define "trainyard.objectStore" -}}
{{- if regexMatch "^(s3|gs|gcs)://" .Values.storage.uri }}true{{ end }}
{{- end }}

{{/* The store's client variables (AWS_*, GOOGLE_*) for the control plane and every Ray pod. */}}
{{- define "trainyard.storageEnvFrom" -}}
{{- with .Values.storage.existingSecret -}}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end }}

{{/* Pods that mount the shared storage PVC (none when storage.uri is set: an object store or your own volume). */}}
{{- define "trainyard.storagePvc" -}}
{{- if and (not .Values.storage.uri) .Values.storage.persistence.enabled }}true{{ end }}
{{- end }}

{{/* Non-root for every pod: uid 1000, gid 100 in both images (deploy/*.Dockerfile). */}}
{{- define "trainyard.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 100
fsGroup: 100
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "trainyard.containerSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
{{- end }}

{{- define "trainyard.storageVolumeMount" -}}
{{- if include "trainyard.storagePvc" . -}}
- name: storage
  mountPath: {{ .Values.storage.mountPath }}
{{- end }}
{{- end }}

{{- define "trainyard.storageVolume" -}}
{{- if include "trainyard.storagePvc" . -}}
- name: storage
  persistentVolumeClaim:
    claimName: {{ include "trainyard.storageClaim" . }}
{{- end }}
{{- end }}
