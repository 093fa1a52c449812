"""Small side files of a root, the same on a local disk and on S3 (a real SeaweedFS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.storage import small_files
from tests.object_store_helpers import new_bucket


@pytest.fixture(params=["local", "s3"])
def folder(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "local":
        return str(tmp_path / "root" / "_readers")
    settings = request.getfixturevalue("object_store")
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return f"s3://{new_bucket(settings, 'small')}/root/_readers"


def test_write_read_list_and_remove(folder: str) -> None:
    small_files.make_folder(folder)
    assert small_files.list_names(folder) == []
    assert small_files.read_text(f"{folder}/a.json") is None
    small_files.write_atomically(f"{folder}/b.json", "old")
    small_files.write_atomically(f"{folder}/b.json", "new")
    small_files.write_atomically(f"{folder}/a.json", "{}")
    assert small_files.list_names(folder) == ["a.json", "b.json"]
    assert small_files.read_text(f"{folder}/b.json") == "new"
    small_files.remove(f"{folder}/b.json")
    small_files.remove(f"{folder}/b.json")  # gone already: nothing to do
    assert small_files.list_names(folder) == ["a.json"]
    assert small_files.is_remote(folder) == folder.startswith("s3://")


def test_folders_sizes_bytes_and_moves(folder: str) -> None:
    """What verify and set_aside read a table with: subfolders, a file's size and bytes, a move
    (on S3 a copy and then a delete) that replaces its target, pyarrow's filesystem."""
    small_files.make_folder(f"{folder}/t/_delta_log")
    small_files.make_folder(f"{folder}/t/aside")
    small_files.write_atomically(f"{folder}/t/_delta_log/0.json", "{}\n")
    small_files.make_folder(f"{folder}/u")
    small_files.write_atomically(f"{folder}/u/a.json", "x")
    assert small_files.list_folders(folder) == ["t", "u"]
    assert small_files.list_folders(f"{folder}/none") == []
    assert small_files.file_size(f"{folder}/t/_delta_log/0.json") == 3
    assert small_files.file_size(f"{folder}/t/_delta_log/1.json") is None
    assert small_files.read_bytes(f"{folder}/t/_delta_log/0.json") == b"{}\n"
    assert small_files.read_bytes(f"{folder}/t/_delta_log/1.json") is None
    small_files.write_atomically(f"{folder}/t/aside/0.json", "a spare copy")
    small_files.move(f"{folder}/t/_delta_log/0.json", f"{folder}/t/aside/0.json")
    assert small_files.list_names(f"{folder}/t/_delta_log") == []
    assert small_files.read_text(f"{folder}/t/aside/0.json") == "{}\n"
    fs, name = small_files.filesystem(f"{folder}/t/aside/0.json")
    assert fs.get_file_info(name).size == 3


def test_bytes_exists_and_remove_folder(folder: str) -> None:
    root = folder.rsplit("/", 1)[0]
    assert not small_files.exists(root) and small_files.read_bytes(f"{folder}/x.bin") is None
    small_files.make_folder(folder)
    small_files.write_atomically(f"{folder}/x.bin", "\u00e9")
    assert small_files.read_bytes(f"{folder}/x.bin") == "\u00e9".encode()
    assert small_files.exists(f"{folder}/x.bin") and small_files.exists(root)
    small_files.remove_folder(root)
    small_files.remove_folder(root)  # gone already: nothing to do
    assert not small_files.exists(f"{folder}/x.bin") and small_files.list_names(folder) == []
    if small_files.is_remote(root):
        with pytest.raises(UsageError, match="a whole bucket"):
            small_files.remove_folder(root.rsplit("/", 1)[0])
