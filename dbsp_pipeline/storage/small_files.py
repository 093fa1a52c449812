"""Small side files of a pipeline root (schema cache, leases, markers), on any store; and the
file access of the code that reads a root's tables file by file (``verify.py``,
``set_aside.py``): subfolders, bytes, a file's size, moves, pyarrow's filesystem of a path.

A path is local, or an object URI (``s3://bucket/key``) of the store the ``AWS_*`` environment
names (``storage/s3_store.py``). A file is replaced atomically either way: locally by a write to
a temporary file, ``fsync`` and rename; on S3 by one PUT, which a reader sees whole or not at all.
A move is one rename locally; on S3, which has no rename, a copy and then a delete (see
``move``).
"""

from __future__ import annotations

import functools
import os
import shutil

import pyarrow.fs as pafs

from dbsp_pipeline.errors import UsageError

_REMOTE = ("s3://", "s3a://")
_LOCAL = pafs.LocalFileSystem()  # named once: pyarrow resolving it per file costs a third


def is_remote(path: str) -> bool:
    """Whether ``path`` is an object URI rather than a local path."""
    return path.startswith(_REMOTE)


def write_atomically(path: str, text: str, durable: bool = True) -> None:
    """Replace ``path`` with ``text``: a reader (or a crash) sees the old file or the new one,
    never a partial one. ``durable=False`` (scratch a crash may lose): a local file is not
    synced to disk first: a reader still sees it whole, but after a crash it may be empty."""
    if is_remote(path):
        with _s3().open_output_stream(_key(path)) as out:
            out.write(text.encode())
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_text(path: str) -> str | None:
    """The text of ``path`` (UTF-8; None if there is no such file)."""
    data = read_bytes(path)
    return None if data is None else data.decode()


def read_bytes(path: str) -> bytes | None:
    """The bytes of the file ``path`` (None if there is no such file)."""
    try:
        if is_remote(path):
            with _s3().open_input_stream(_key(path)) as src:
                return bytes(src.read())
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def exists(path: str) -> bool:
    """Whether there is a file or a folder at ``path`` (on an object store: an object at
    ``path`` or any object below ``path/``)."""
    if not is_remote(path):
        return os.path.exists(path)
    return _s3().get_file_info(_key(path).rstrip("/")).type != pafs.FileType.NotFound  # type: ignore[no-any-return]


def remove_folder(folder: str) -> None:
    """Delete ``folder`` and everything in it, if it is there (on an object store: every
    object below ``folder/``; a whole bucket is refused, ``UsageError``)."""
    if not is_remote(folder):
        shutil.rmtree(folder, ignore_errors=True)
        return
    key = _key(folder).rstrip("/")
    if key.count("/") == 0:
        raise UsageError(f"{folder}: refusing to delete a whole bucket (name a prefix)")
    _s3().delete_dir_contents(key, missing_dir_ok=True)
    try:  # the folder's own marker object, where a store keeps one: a listing shows it else
        _s3().delete_dir(key)
    except (FileNotFoundError, OSError):
        pass


def remove(path: str) -> None:
    """Delete the file ``path`` if it is there."""
    try:
        if is_remote(path):
            _s3().delete_file(_key(path))
        else:
            os.remove(path)
    except FileNotFoundError:
        pass


def list_names(folder: str) -> list[str]:
    """The names of the files in ``folder``, sorted (none if there is no such folder)."""
    if is_remote(folder):
        infos = _s3().get_file_info(pafs.FileSelector(_key(folder), allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []


def make_folder(folder: str) -> None:
    """Make ``folder`` exist (an object store has no folders: nothing to do there)."""
    if not is_remote(folder):
        os.makedirs(folder, exist_ok=True)


def count_files(folder: str) -> int:
    """How many files there are below ``folder``, at any depth (0 if there is no such
    folder)."""
    fs, path = filesystem(folder)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sum(1 for i in infos if i.type == pafs.FileType.File)


def list_folders(folder: str) -> list[str]:
    """The names of the subfolders of ``folder``, sorted (none if there is no such folder). On
    S3 a subfolder is a key prefix that holds at least one object."""
    if is_remote(folder):
        infos = _s3().get_file_info(pafs.FileSelector(_key(folder), allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
    try:
        return sorted(n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n)))
    except FileNotFoundError:
        return []


def file_size(path: str) -> int | None:
    """The size in bytes of the file ``path`` (None if there is no such file). ``OSError`` when
    the store cannot say."""
    if is_remote(path):
        info = _s3().get_file_info(_key(path))
        return info.size if info.type == pafs.FileType.File else None
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def move(source: str, target: str) -> None:
    """Move the file ``source`` to ``target`` (same store; replaces ``target``). Locally one
    rename: a crash leaves one of the two. On S3, which has no rename, a copy and then a delete:
    a crash in between leaves the file at both places, and the caller must be able to move it
    again (the copy is replaced)."""
    if is_remote(source):
        s3 = _s3()
        s3.copy_file(_key(source), _key(target))
        s3.delete_file(_key(source))
    else:
        os.replace(source, target)


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of ``path`` and the path as it names it, for pyarrow's readers
    (``pq.read_metadata(p, filesystem=fs)``)."""
    return (_s3(), _key(path)) if is_remote(path) else (_LOCAL, path)


def _key(path: str) -> str:
    return path.split("://", 1)[1]


def _s3() -> pafs.S3FileSystem:
    """The filesystem of the store the ``AWS_*`` environment names now."""
    from dbsp_pipeline.storage.s3_store import s3_options

    return _s3_for(tuple(sorted(s3_options("s3://").items())))


@functools.cache
def _s3_for(options: tuple[tuple[str, str], ...]) -> pafs.S3FileSystem:
    from dbsp_pipeline.storage.s3_store import s3_filesystem

    return s3_filesystem(dict(options))
