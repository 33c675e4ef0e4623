"""The landing page's pool curve (exporter/poolchart.py): one SVG, today's point marked."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from prefixwatch.core.kv.poolcurve import curve_of
from prefixwatch.exporter.poolchart import pool_curve_svg

SVG = "{http://www.w3.org/2000/svg}"


def test_the_curve_is_one_path_through_every_pool_size_with_today_marked() -> None:
    curve = curve_of(1000, 520, {"1.25": 90, "1.5": 140, "2": 240, "4": 350})
    root = ET.fromstring(pool_curve_svg(curve, "hit ratio by KV pool size"))
    (path,) = root.iter(f"{SVG}path")
    assert path.get("d").count("L") == 4  # 1x, then 1.25, 1.5, 2 and 4x
    titles = [t.text for t in root.iter(f"{SVG}title")]
    assert titles == ["1.25x: 61.0%", "1.5x: 66.0%", "2x: 76.0%", "4x: 87.0%", "today: 52.0%"]
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "today 52%" in texts and "4x" in texts
