{{/*
Combinations of values that cannot work. values.schema.json checks each value's shape;
this checks how they fit together, and fails the render with a message naming the values.
Included once, from configmap.yaml (always rendered).
*/}}
{{- define "trainyard.validate" -}}
{{- $v := .Values }}
{{- $sqlite := include "trainyard.sqlite" . }}
{{- if and $sqlite (eq $v.mode "production") }}
{{- fail "mode=production needs an external PostgreSQL: set database.url (postgresql+psycopg://USER:PASSWORD@HOST:5432/DB) or database.existingSecret. SQLite is for mode=demo only." }}
{{- end }}
{{- if and $sqlite (gt (int $v.controlPlane.replicas) 1) }}
{{- fail (printf "controlPlane.replicas=%d needs PostgreSQL: SQLite (no database.url) allows one control-plane replica only. Set database.url or database.existingSecret, or controlPlane.replicas=1." (int $v.controlPlane.replicas)) }}
{{- end }}
{{- if and $v.database.url (not (hasPrefix "postgresql+psycopg://" $v.database.url)) }}
{{- fail "database.url must be a PostgreSQL URL for the psycopg driver: postgresql+psycopg://USER:PASSWORD@HOST:5432/DB" }}
{{- end }}
{{- if and $v.database.url $v.database.existingSecret }}
{{- fail "set either database.url or database.existingSecret, not both" }}
{{- end }}
{{- if and (not $v.ray.cluster.enabled) (not $v.ray.address) }}
{{- fail "ray.cluster.enabled=false needs ray.address, the Ray Client address of an existing cluster (ray://HOST:10001)" }}
{{- end }}
{{- if and $v.ray.cluster.enabled $v.ray.address }}
{{- fail "ray.address is for an existing cluster: set ray.cluster.enabled=false to use it, or leave it empty" }}
{{- end }}
{{- $w := $v.ray.cluster.workers }}
{{- if gt (int $w.minReplicas) (int $w.maxReplicas) }}
{{- fail (printf "ray.cluster.workers.minReplicas=%d is above maxReplicas=%d" (int $w.minReplicas) (int $w.maxReplicas)) }}
{{- end }}
{{- if or (lt (int $w.replicas) (int $w.minReplicas)) (gt (int $w.replicas) (int $w.maxReplicas)) }}
{{- fail (printf "ray.cluster.workers.replicas=%d must lie between minReplicas=%d and maxReplicas=%d" (int $w.replicas) (int $w.minReplicas) (int $w.maxReplicas)) }}
{{- end }}
{{- if and (not $v.storage.uri) (not $v.storage.persistence.enabled) }}
{{- fail "job storage is needed: set storage.uri to an object store (s3://bucket/prefix, gs://bucket/prefix), storage.persistence.enabled=true for a shared volume, or storage.uri to a file:// URI on a volume mounted in every pod" }}
{{- end }}
{{- if and $v.storage.uri (contains "://" $v.storage.uri) (not (regexMatch "^(file|s3|gs|gcs)://" $v.storage.uri)) }}
{{- fail (printf "storage.uri=%s: not a supported store; use s3://, gs:// or file://" $v.storage.uri) }}
{{- end }}
{{- if and (include "trainyard.objectStore" .) (not $v.storage.existingSecret) (not $v.storage.credentialsFromPods) }}
{{- fail (printf "storage.uri=%s needs credentials in the control plane and every Ray pod: set storage.existingSecret to a Secret holding the store's variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL, AWS_REGION for MinIO or another S3-compatible store), or storage.credentialsFromPods=true when the pods get them another way (a cloud identity on serviceAccount.annotations, extraEnv)" $v.storage.uri) }}
{{- end }}
{{- end }}
