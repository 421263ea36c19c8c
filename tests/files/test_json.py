from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from tide.files import (
    ConfigFileError,
    load_json_with_fallback,
    parse_config_json,
    write_file_atomically,
    write_json_atomically,
    write_json_bytes_atomically,
)
from tide.files import _json as config_files


def _read(path: Path) -> object:
    return json.loads(path.read_text())


def test_first_write_has_no_backup(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    write_json_atomically(path, {"v": 1})
    assert _read(path) == {"v": 1}
    assert not (tmp_path / "topics.json.bak").exists()
    assert not (tmp_path / "topics.json.tmp").exists()


def test_second_write_keeps_previous_as_bak(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    write_json_atomically(path, {"v": 1})
    write_json_atomically(path, {"v": 2})
    write_json_atomically(path, {"v": 3})
    assert _read(path) == {"v": 3}
    assert _read(tmp_path / "topics.json.bak") == {"v": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topics.json", "topics.json.bak"]


def test_stale_temporaries_from_a_crash_are_replaced(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write_json_atomically(path, {"v": 1})
    (tmp_path / "c.json.tmp").write_text("{torn")
    (tmp_path / "c.json.bak.tmp").write_text("{torn")
    write_json_atomically(path, {"v": 2})
    assert _read(path) == {"v": 2}
    assert _read(tmp_path / "c.json.bak") == {"v": 1}
    assert not (tmp_path / "c.json.bak.tmp").exists()


def test_backup_by_copy_when_hard_links_are_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    path = tmp_path / "c.json"
    write_json_atomically(path, {"v": 1})
    monkeypatch.setattr(os, "link", no_link)
    write_json_atomically(path, {"v": 2})
    assert _read(tmp_path / "c.json.bak") == {"v": 1}
    assert _read(path) == {"v": 2}


def test_corrupt_main_is_not_rotated_over_a_good_backup(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write_json_atomically(path, {"v": 1})
    write_json_atomically(path, {"v": 2})
    path.write_text('{"v": 2')  # damaged behind our back
    write_json_atomically(path, {"v": 3})
    assert _read(path) == {"v": 3}
    assert _read(tmp_path / "c.json.bak") == {"v": 1}


def test_load_main(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write_json_atomically(path, {"v": 1})
    assert load_json_with_fallback(path) == ({"v": 1}, "main")


def test_load_nothing(tmp_path: Path) -> None:
    assert load_json_with_fallback(tmp_path / "c.json") == (None, "none")


@pytest.mark.parametrize("damage", ["", "{", "not json", "\xff", '{"a": NaN}'])
def test_load_falls_back_to_bak_when_main_is_corrupt(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.json"
    write_json_atomically(path, {"v": 1})
    write_json_atomically(path, {"v": 2})
    path.write_text(damage, encoding="latin-1")
    with caplog.at_level(logging.WARNING, logger="tide.storage.config"):
        assert load_json_with_fallback(path) == ({"v": 1}, "bak")
    assert "loaded the backup" in caplog.text


def test_load_falls_back_to_bak_when_main_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write_json_atomically(path, {"v": 1})
    write_json_atomically(path, {"v": 2})
    path.unlink()
    assert load_json_with_fallback(path) == ({"v": 1}, "bak")


def test_both_corrupt_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text("{")
    (tmp_path / "c.json.bak").write_text("[")
    with pytest.raises(ConfigFileError, match="refusing to start with an empty table"):
        load_json_with_fallback(path)


def test_corrupt_main_and_missing_bak_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text("{")
    with pytest.raises(ConfigFileError, match=r"is not valid JSON.*backup .* is missing"):
        load_json_with_fallback(path)


def test_missing_main_and_corrupt_bak_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    (tmp_path / "c.json.bak").write_text("{")
    with pytest.raises(ConfigFileError, match=r"is missing.*is not valid JSON"):
        load_json_with_fallback(path)


def test_oversized_file_is_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"v": "' + "x" * 100 + '"}')
    with pytest.raises(ConfigFileError, match="larger than the limit of 64 bytes"):
        load_json_with_fallback(path, max_bytes=64)


def test_oversized_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_files, "MAX_CONFIG_FILE_BYTES", 16)
    with pytest.raises(config_files.ConfigLimitError, match="the limit is 16 bytes"):
        write_json_atomically(tmp_path / "c.json", {"v": "x" * 100})
    assert not (tmp_path / "c.json").exists()


def test_io_errors_other_than_not_found_are_not_hidden(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.mkdir()
    (tmp_path / "c.json.bak").write_text("{}")
    with pytest.raises(IsADirectoryError):
        load_json_with_fallback(path)


def test_fastjson_bare_numeric_keys_are_accepted() -> None:
    text = '{\n\t"offsetTable":{\n\t\t"TopicTest@g":{0:250,1:251,-1:3}\n\t}\n}'
    assert parse_config_json(text) == {
        "offsetTable": {"TopicTest@g": {"0": 250, "1": 251, "-1": 3}}
    }


def test_bare_key_repair_leaves_strings_alone() -> None:
    text = '{"a":"{1:2}, \\"x\\",3:", 7:"b"}'
    assert parse_config_json(text) == {"a": '{1:2}, "x",3:', "7": "b"}


def test_unrepairable_text_reports_the_original_error() -> None:
    with pytest.raises(json.JSONDecodeError, match="Expecting property name"):
        parse_config_json("{1:2, oops}")


def test_json_bytes_are_written_as_given_and_the_previous_kept_as_bak(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    write_json_atomically(path, {"v": 1})
    copy = b'{"v":2,  "from": "the master"}'  # another store's bytes, not re-encoded
    write_json_bytes_atomically(path, copy)
    assert path.read_bytes() == copy
    assert _read(tmp_path / "topics.json.bak") == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topics.json", "topics.json.bak"]


def test_binary_file_is_replaced_whole_without_a_bak(tmp_path: Path) -> None:
    path = tmp_path / "timercheck"
    write_file_atomically(path, b"\x01" * 4096)
    (tmp_path / "timercheck.tmp").write_bytes(b"torn")  # a crash's leftover
    write_file_atomically(path, b"\x02" * 4096)
    assert path.read_bytes() == b"\x02" * 4096
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timercheck"]
