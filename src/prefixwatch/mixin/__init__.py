"""The Prometheus/Grafana mixin.

One config feeds rules, alerts, dashboards, manifests and runbook text.
"""
