"""The demo's Prometheus loads the alert rules whatever --data-dir is given as."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from prefixwatch.core.vocab import rulenames
from prefixwatch.demo.backends import Backends
from tests.conftest import free_port, require_binary


@pytest.mark.integration
def test_a_relative_data_dir_still_loads_the_rules(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    prometheus = require_binary("prometheus", "prometheus")
    alertmanager = require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    monkeypatch.chdir(tmp_path)
    backends = Backends(Path("demo"), free_port(), free_port(), free_port(), time_scale=0.05)
    try:
        backends.start(prometheus, alertmanager, f"http://127.0.0.1:{free_port()}/")
        groups = requests.get(f"{backends.prometheus_url}/api/v1/rules", timeout=5).json()
    finally:
        backends.stop(time.monotonic() + 2)
    names = {rule["name"] for group in groups["data"]["groups"] for rule in group["rules"]}
    assert rulenames.ALERT_LOW in names
