{{/*
Supervisors on the Ray head: the memory Ray may give them there, and how many fit.
The head's memory limit minus what Ray keeps for itself (ray.cluster.supervisors.headReservedMb:
GCS, raylet, dashboard, autoscaler and the head's object store) is the Ray `memory` the head
offers (its rayStartParams `memory`); `slots` of the supervisors' resource, each supervisor
reserving memoryMb of it. slots=0 derives them from that memory.
*/}}

{{/* A Kubernetes memory quantity (8Gi, 8192Mi, 8G, 8589934592) in MiB, rounded down. */}}
{{- define "trainyard.mebibytes" -}}
{{- $q := toString . }}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- $num := regexFind "^[0-9.]+" $q }}
{{- $unit := trimPrefix $num $q }}
{{- $factor := 1 }}
{{- if $unit }}{{ $factor = get $units $unit | default 0 }}{{ end }}
{{- if not $factor }}{{ fail (printf "memory quantity %q: unit %q is not one of Ki, Mi, Gi, Ti, k, M, G, T" $q $unit) }}{{ end }}
{{- div (mulf (float64 $num) $factor | int64) 1048576 }}
{{- end }}

{{/* MiB of Ray `memory` the head offers supervisors (its limit, else its request, less headReservedMb). */}}
{{- define "trainyard.supervisorMemoryMb" -}}
{{- $rc := .Values.ray.cluster }}
{{- $res := $rc.head.resources }}
{{- $limit := (($res.limits | default dict).memory) | default (($res.requests | default dict).memory) }}
{{- if not $limit }}{{ fail "ray.cluster.head.resources.limits.memory is needed: supervisors run on the head and their slots are sized from its memory" }}{{ end }}
{{- sub (include "trainyard.mebibytes" $limit | int64) (int64 $rc.supervisors.headReservedMb) }}
{{- end }}

{{/* How many supervisors the head holds (the supervisors' resource it offers). Fails when they cannot fit. */}}
{{- define "trainyard.supervisorSlots" -}}
{{- $rc := .Values.ray.cluster }}
{{- $s := $rc.supervisors }}
{{- $limit := (($rc.head.resources.limits | default dict).memory) | default (($rc.head.resources.requests | default dict).memory) }}
{{- $budget := include "trainyard.supervisorMemoryMb" . | int64 }}
{{- $each := int64 $s.memoryMb }}
{{- if lt $budget $each }}
{{- fail (printf "ray.cluster.head.resources.limits.memory=%s less ray.cluster.supervisors.headReservedMb=%d leaves %d MiB for supervisors, less than one supervisor's ray.cluster.supervisors.memoryMb=%d: raise the head's memory or lower headReservedMb" $limit (int64 $s.headReservedMb) $budget $each) }}
{{- end }}
{{- if ge (int64 $rc.head.objectStoreMb) (int64 $s.headReservedMb) }}
{{- fail (printf "ray.cluster.head.objectStoreMb=%d must be below ray.cluster.supervisors.headReservedMb=%d, which also holds Ray's own processes" (int64 $rc.head.objectStoreMb) (int64 $s.headReservedMb)) }}
{{- end }}
{{- if eq (int64 $s.slots) 0 }}
{{- if eq $each 0 }}{{ fail "ray.cluster.supervisors.slots=0 derives the slots from memoryMb: with memoryMb=0 set slots" }}{{ end }}
{{- div $budget $each }}
{{- else }}
{{- $asked := mul (int64 $s.slots) $each }}
{{- if gt $asked $budget }}
{{- fail (printf "ray.cluster.supervisors.slots=%d x memoryMb=%d = %d MiB exceeds the %d MiB the head offers supervisors (ray.cluster.head.resources.limits.memory=%s less headReservedMb=%d), which holds %d: the jobs past those would wait for a supervisor forever. Lower slots (0 derives them), or raise the head's memory" (int64 $s.slots) $each $asked $budget $limit (int64 $s.headReservedMb) (div $budget (max $each 1))) }}
{{- end }}
{{- $s.slots | int64 }}
{{- end }}
{{- end }}
