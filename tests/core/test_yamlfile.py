"""The one YAML loader of config files: bad files name file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.yamlfile import MAX_BYTES, ConfigFile


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
        ConfigFile.load(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}{where} not valid YAML: ") and problem in message
    assert "\n" not in message


def test_mapping_empty_missing_binary_and_huge(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yml"
    empty.write_text("")
    assert ConfigFile.load(str(empty)).data == {}
    listed = tmp_path / "list.yml"
    listed.write_text("- a\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        ConfigFile.load(str(listed))
    with pytest.raises(ConfigError, match="cannot read rules config"):
        ConfigFile.load(str(tmp_path / "missing.yml"), what="rules config")
    binary = tmp_path / "bin.yml"
    binary.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        ConfigFile.load(str(binary))
    huge = tmp_path / "huge.yml"
    huge.write_bytes(b"#" * (MAX_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than"):
        ConfigFile.load(str(huge))


def test_keys_have_places_and_unknown_keys_a_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "c.yml"
    path.write_text("targets:\n  - url: http://a\n    timeot: 3\ndiagnosis:\n  windw: 5m\n")
    cf = ConfigFile.load(str(path))
    assert cf.where("targets", "0", "timeot") == f"{path}:3:5"
    assert cf.where("diagnosis", "nothing") == f"{path}:4:1"
    with pytest.raises(ConfigError) as err:
        cf.check_keys(cf.data["targets"][0], ("url", "timeout"), "targets", "0")
    assert str(err.value) == (f"{path}:3:5: unknown key 'targets.0.timeot' "
                              "(did you mean 'timeout'?)")
    with pytest.raises(ConfigError, match=r":5:3: unknown key 'diagnosis.windw' \(did you "
                                          r"mean 'window'\?\)"):
        cf.check_keys(cf.data["diagnosis"], ("window", "cold_start"), "diagnosis")
