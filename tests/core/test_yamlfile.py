"""The one YAML loader of config files: bad files name file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.yamlfile import MAX_BYTES, load_mapping, load_yaml


@pytest.mark.parametrize("text,where,problem", [
    ("targets: [", ":1:11:", "expected the node content"),
    ("a: 1\n b: 2\n", ":2:3:", "mapping values are not allowed here"),
    ("x: 'unterminated\n", ":2:1:", "unexpected end of stream"),
    ("\tx: 1\n", ":1:1:", "cannot start any token"),
])
def test_bad_yaml_names_file_line_and_column(tmp_path: Path, text: str, where: str,
                                             problem: str) -> None:
    path = tmp_path / "c.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_yaml(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}{where} not valid YAML: ") and problem in message
    assert "\n" not in message


def test_mapping_empty_missing_binary_and_huge(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yml"
    empty.write_text("")
    assert load_mapping(str(empty)) == {}
    listed = tmp_path / "list.yml"
    listed.write_text("- a\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_mapping(str(listed))
    with pytest.raises(ConfigError, match="cannot read rules config"):
        load_yaml(str(tmp_path / "missing.yml"), what="rules config")
    binary = tmp_path / "bin.yml"
    binary.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_yaml(str(binary))
    huge = tmp_path / "huge.yml"
    huge.write_bytes(b"#" * (MAX_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than"):
        load_yaml(str(huge))
