"""Where panels go: left to right, wrapping at Grafana's 24 columns (ids: grafanalib's
``auto_panel_ids``, in the order the panels were laid out).

No dashboard counts an id or an x/y by hand, so adding, removing or resizing a panel (or a
source without some series) never leaves a hole or a duplicate id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grafanalib import core as g

COLUMNS = 24


@dataclass
class Placed:
    panel: Any
    width: int
    height: int


def flow(placed: list[Placed], columns: int = COLUMNS) -> list[Any]:
    """The panels with gridPos set: each row is as tall as its tallest panel."""
    x = y = row_height = 0
    out = []
    for item in placed:
        if not 0 < item.width <= columns:
            raise ValueError(f"panel width {item.width} is not within 1..{columns}")
        if x + item.width > columns:
            x, y, row_height = 0, y + row_height, 0
        item.panel.gridPos = g.GridPos(h=item.height, w=item.width, x=x, y=y)
        x += item.width
        row_height = max(row_height, item.height)
        out.append(item.panel)
    return out
