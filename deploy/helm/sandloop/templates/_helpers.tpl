{{- define "sandloop.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "sandloop.hostSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: host
{{- end }}

{{- define "sandloop.gatewaySelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "sandloop.secretEnv" -}}
- name: SANDLOOP_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.key }}
- name: SANDLOOP_GATEWAY_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ .Values.gatewaySecret.existingSecret }}
      key: {{ .Values.gatewaySecret.key }}
{{- end }}
