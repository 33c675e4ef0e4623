"""The exporter's kv_pool_blocks (the pool what-if's size when the engine's page has none)."""

from __future__ import annotations

import pytest

from prefixwatch.core.errors import ConfigError
from prefixwatch.exporter.config import ConfigFlags, build_config


def test_the_pool_size_config_key_and_its_errors(tmp_path) -> None:
    path = tmp_path / "c.yml"
    path.write_text("target_defaults: {kv_pool_blocks: 4096}\n"
                    "targets: [{url: 'http://a:1/metrics', name: a},\n"
                    "          {url: 'http://b:1/metrics', name: b, kv_pool_blocks: 700}]\n")
    a, b = build_config(ConfigFlags(config_file=str(path)), environ={}).targets
    assert (a.kv_pool_blocks, b.kv_pool_blocks) == (4096, 700)
    for bad in ("1", "'many'", "2.5", "true"):
        path.write_text(f"targets: [{{url: 'http://a:1/metrics', kv_pool_blocks: {bad}}}]\n")
        with pytest.raises(ConfigError, match="kv_pool_blocks must be a whole number"):
            build_config(ConfigFlags(config_file=str(path)), environ={})
