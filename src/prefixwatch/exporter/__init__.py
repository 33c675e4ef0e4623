"""The sidecar: polls engines' /metrics, keeps windows, diagnoses, serves prefixwatch_* and OTLP."""
