{{/* Labels every object of a release carries, and the ones selecting its pods (plus a component). */}}
{{- define "dask-clust.selector" -}}
app.kubernetes.io/name: dask-clust
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dask-clust.labels" -}}
{{ include "dask-clust.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* TLS for every role from the mounted Secret; DEFAULT_SCHEME makes a scheme-less address tls:// too. */}}
{{- define "dask-clust.tlsEnv" -}}
- name: DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME
  value: tls
- name: DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION
  value: "True"
- name: DASK_DISTRIBUTED__COMM__TLS__CA_FILE
  value: /etc/dask-clust/tls/ca.crt
{{- range $role := list "SCHEDULER" "WORKER" "CLIENT" }}
- name: DASK_DISTRIBUTED__COMM__TLS__{{ $role }}__CERT
  value: /etc/dask-clust/tls/tls.crt
- name: DASK_DISTRIBUTED__COMM__TLS__{{ $role }}__KEY
  value: /etc/dask-clust/tls/tls.key
{{- end }}
{{- end -}}

{{/* The pod-level settings: no service-account token (nothing here talks to the Kubernetes API), the
     image's user, the Secret and the scratch volume. */}}
{{- define "dask-clust.podSpec" -}}
automountServiceAccountToken: false
enableServiceLinks: false
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  runAsGroup: 1000
  fsGroup: 1000
  seccompProfile:
    type: RuntimeDefault
volumes:
  - name: tls
    secret:
      secretName: {{ .Values.tls.secretName }}
      defaultMode: 0440
  - name: scratch
    emptyDir:
      sizeLimit: {{ .Values.scratch.sizeLimit }}
{{- end -}}

{{/* Every container: read-only root, no privilege escalation, no capabilities. */}}
{{- define "dask-clust.container" -}}
image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
imagePullPolicy: {{ .Values.image.pullPolicy }}
securityContext:
  runAsNonRoot: true
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop:
      - ALL
  seccompProfile:
    type: RuntimeDefault
volumeMounts:
  - name: tls
    mountPath: /etc/dask-clust/tls
    readOnly: true
  - name: scratch
    mountPath: /tmp
{{- end -}}

{{/* DNS, which every pod of the release needs to find the others by name. */}}
{{- define "dask-clust.dnsEgress" -}}
- to:
    - namespaceSelector: {}
      podSelector:
        matchLabels:
          k8s-app: kube-dns
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end -}}
