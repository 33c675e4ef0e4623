"""Dashboard JSON: deterministic, and normalised to Grafana's current dashboard schema.

grafanalib writes legacy keys and nulls (``"value": "null"`` on base threshold steps, ``rows``,
``schemaVersion`` 12, ...); we drop nulls and legacy keys and declare the schema version of the
panel JSON we actually emit (see docs/dashboards.md). Keys are sorted, so the committed files
only change when a dashboard does.
"""

from __future__ import annotations

import json
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

SCHEMA_VERSION = 39

_LEGACY_DASHBOARD_KEYS = {"rows", "hideControls", "sharedCrosshair", "style", "inputs",
                          "__inputs", "gnetId", "id", "annotations"}
_LEGACY_PANEL_KEYS = {"cacheTimeout", "error", "height", "hideTimeOverride", "minSpan", "span",
                      "repeatDirection", "maxPerRow", "editable", "thresholdType",
                      "maxDataPoints", "timeFrom", "timeShift", "repeat"}
_LEGACY_TARGET_KEYS = {"query", "target", "metric", "step", "intervalFactor", "interval",
                       "hide", "instant", "format"}


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items()
                if v is not None and not (isinstance(v, str) and v == "null")}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _panel(panel: dict[str, Any]) -> dict[str, Any]:
    panel = {k: v for k, v in panel.items() if k not in _LEGACY_PANEL_KEYS}
    panel["targets"] = [{k: v for k, v in t.items() if k not in _LEGACY_TARGET_KEYS}
                        for t in panel.get("targets", [])]
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    steps = defaults.get("thresholds", {}).get("steps", [])
    if steps:
        defaults["thresholds"]["steps"] = [
            {"color": st["color"], "value": None if i == 0 else st["value"]}
            for i, st in enumerate(steps)]
    for key in ("transformations", "links"):
        if panel.get(key) == []:
            del panel[key]
    return panel


def normalize(dashboard: dict[str, Any]) -> dict[str, Any]:
    """grafanalib's JSON, brought to Grafana's current schema (see module docstring)."""
    out = {k: v for k, v in dashboard.items() if k not in _LEGACY_DASHBOARD_KEYS}
    out["schemaVersion"] = SCHEMA_VERSION
    out["version"] = 1
    out["editable"] = True
    out["panels"] = [_panel(p) for p in out.get("panels", [])]
    out.get("timepicker", {}).pop("time_options", None)
    for var in out.get("templating", {}).get("list", []):
        if isinstance(var.get("current"), dict):
            var["current"].pop("tags", None)
            if var["current"].get("value") == "$__all":
                var["current"]["text"] = "All"
        for key in ("tagValuesQuery", "tagsQuery", "useTags", "auto", "auto_count", "auto_min",
                    "datasource" if var.get("type") == "datasource" else "_"):
            var.pop(key, None)
    steps_kept = [p.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get(
        "steps", []) for p in out["panels"]]
    cleaned = _drop_nulls(out)
    # The base threshold step's value is a real JSON null in Grafana's schema: put it back.
    for panel, steps in zip(cleaned["panels"], steps_kept, strict=True):
        if steps:
            panel["fieldConfig"]["defaults"]["thresholds"]["steps"] = steps
    return cleaned


def to_json(dashboard: g.Dashboard, datasource_uid: str | None = None) -> str:
    """The dashboard's JSON text; ``datasource_uid`` preselects a Prometheus datasource."""
    data = normalize(json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder)))
    if datasource_uid:
        for var in data["templating"]["list"]:
            if var["name"] == "datasource":
                var["current"] = {"text": datasource_uid, "value": datasource_uid}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def queries(dashboard_json: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query in a dashboard's JSON."""
    return [(p["title"], t["expr"]) for p in dashboard_json["panels"]
            for t in p.get("targets", [])]
