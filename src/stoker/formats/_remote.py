"""Paths and URLs: local files, or anything fsspec opens (``s3://``, ``gs://``, ``http://``,
``memory://`` ...), with an optional local cache directory; and atomic local writes.

fsspec is imported only when a URL needs it (the ``remote`` extra plus the protocol's
package, e.g. ``s3fs``). With a ``cache_dir`` a remote file is downloaded once, whole,
through a temporary name (no reader sees half a file), then read locally; without one,
reads go to the store (byte ranges, or a stream for sequential reads).

Whatever may open a URL takes ``storage_options`` (fsspec keyword arguments), and readers
pickle them to their workers, which under ``spawn`` and ``forkserver`` see neither the
parent's ``fsspec.config.conf`` nor environment variables set after start-up.

Temporary files are named ``.NAME.stoker-tmp-PID-RANDOM`` beside their final name, so that
a later writer can remove those whose process died (:func:`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any

from stoker._engine._segments import pid_alive

_TMP_MARK = ".stoker-tmp-"
_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_PATTERN = re.compile(r"[*?[]|\{\d+\.\.\d+\}")
"""What makes a name a pattern: a glob character or a brace range."""
_COPY_CHUNK = 1 << 22


def is_remote(url: str) -> bool:
    """Whether ``url`` names something fsspec must open (a protocol other than file).

    >>> is_remote("s3://bucket/a.tar"), is_remote("/data/a.tar"), is_remote("file:///a")
    (True, False, False)
    """
    head, sep, _ = url.partition("://")
    return bool(sep) and head.lower() not in ("file", "local") and "/" not in head


def local_path(url: str) -> str:
    """A local path for a local ``url`` (``file://`` removed, ``~`` expanded).

    >>> import os
    >>> local_path("file://" + os.getcwd()) == os.getcwd()
    True
    """
    if url.startswith("file://"):
        url = url[len("file://") :]
    return os.path.expanduser(url)


def check_storage_options(storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``storage_options`` for an object to keep (and pickle): a dict, {} for None.

    >>> check_storage_options(None), check_storage_options({"anon": True})
    ({}, {'anon': True})

    Raises:
        TypeError: when it is not a mapping with str keys (the message never shows values,
            which may be credentials).
    """
    if storage_options is None:
        return {}
    if not isinstance(storage_options, Mapping):
        raise TypeError(
            "storage_options must be a mapping of fsspec filesystem arguments (e.g. "
            f"{{'endpoint_url': 'http://127.0.0.1:9000'}}), got a "
            f"{type(storage_options).__name__}; pass a dict, or None for fsspec's defaults."
        )
    for key in storage_options:
        if not isinstance(key, str):
            raise TypeError(
                f"storage_options keys must be str (fsspec argument names), got {key!r} "
                f"(a {type(key).__name__}); name the argument as a string."
            )
    return dict(storage_options)


def filesystem(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    """The fsspec filesystem and in-filesystem path of a remote ``url``, made with the
    keyword arguments ``storage_options`` (none: fsspec's configuration and defaults).

    Raises:
        ModuleNotFoundError: when fsspec (or the protocol's package) is not installed.
    """
    try:
        import fsspec
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"reading {url!r} needs fsspec: `pip install 'stoker[remote]'` (plus the "
            "protocol's package, e.g. s3fs, gcsfs or aiohttp for http)."
        ) from exc
    fs, path = fsspec.core.url_to_fs(url, **storage_options)
    return fs, path


def _with_protocol(url: str, path: str) -> str:
    protocol = url.split("://", 1)[0]
    return (
        path
        if "://" in path
        else f"{protocol}://{path.lstrip('/') if protocol == 'memory' else path}"
    )


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's brace ranges: ``a-{00..02}.tar`` is three names, zero padding kept.

    >>> expand_braces("s-{08..10}.tar")
    ['s-08.tar', 's-09.tar', 's-10.tar']
    """
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    lo, hi = m.group(1), m.group(2)
    width = len(lo) if lo.startswith("0") else 0
    out: list[str] = []
    for i in range(int(lo), int(hi) + 1):
        head = pattern[: m.start()] + str(i).zfill(width)
        out.extend(head + rest for rest in expand_braces(pattern[m.end() :]))
    return out


def expand(
    urls: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    suffix: str,
    storage_options: Mapping[str, Any],
) -> list[str]:
    """The shard URLs named by ``urls``: a list, a brace range, a glob, or a directory.

    A name that exists (a file, or a directory: its files ending in ``suffix``, sorted) is
    taken as it is, even when it holds ``[``, ``?``, ``*`` or braces: only a name that
    names nothing is expanded as a brace range and then a glob. So ``run[1]/out`` reads
    the folder of that name, and an explicit list of existing files is never expanded.

    Raises:
        FileNotFoundError: when nothing matches.
    """
    items = (
        [os.fspath(urls)] if isinstance(urls, (str, os.PathLike)) else [os.fspath(u) for u in urls]
    )
    out: list[str] = []
    for item in items:
        out.extend(_expand_one(item, suffix, storage_options))
    if not out:
        raise FileNotFoundError(
            f"no shard found for {urls!r}: pass shard paths or URLs, a brace range "
            f"(shard-{{000000..000009}}{suffix}), a glob or a directory of *{suffix} files."
        )
    return out


def _expand_one(name: str, suffix: str, storage_options: Mapping[str, Any]) -> list[str]:
    """The shards one name stands for: itself (or its listing) when it exists, else the
    names its braces and glob characters match."""
    remote = is_remote(name)
    exists: Callable[[str], Any]
    isdir: Callable[[str], Any]
    match: Callable[[str], Any]
    if remote:
        fs, path = filesystem(name, storage_options)
        exists, isdir, match = fs.exists, fs.isdir, fs.glob

        def listing(folder: str) -> list[str]:
            return list(fs.ls(folder, detail=False))

        def url(p: str) -> str:
            return _with_protocol(name, p)
    else:
        path = local_path(name)
        exists, isdir, match = os.path.exists, os.path.isdir, glob.glob

        def listing(folder: str) -> list[str]:
            return [os.path.join(folder, n) for n in os.listdir(folder)]

        def url(p: str) -> str:
            return p

    literal = _PATTERN.search(path) is None or bool(exists(path))
    out: list[str] = []
    for each in [path] if literal else expand_braces(path):
        if not literal and any(c in each for c in "*?[") and not exists(each):
            out.extend(sorted(url(p) for p in match(each)))
        elif isdir(each):
            found = [p for p in listing(each) if p.endswith(suffix) and _TMP_MARK not in p]
            out.extend(sorted(url(p) for p in found))
        else:
            out.append(name if literal and remote else url(each))
    return out


def exists(url: str, storage_options: Mapping[str, Any]) -> bool:
    """Whether ``url`` names an existing file."""
    if not is_remote(url):
        return os.path.isfile(local_path(url))
    fs, path = filesystem(url, storage_options)
    return bool(fs.exists(path))


def size(url: str, storage_options: Mapping[str, Any]) -> int:
    """The size of the file at ``url`` in bytes."""
    if not is_remote(url):
        return os.path.getsize(local_path(url))
    fs, path = filesystem(url, storage_options)
    return int(fs.size(path))


def read_bytes(url: str, storage_options: Mapping[str, Any]) -> bytes:
    """The whole file at ``url``."""
    if not is_remote(url):
        with open(local_path(url), "rb") as f:
            return f.read()
    fs, path = filesystem(url, storage_options)
    return bytes(fs.cat_file(path))


def cached(
    url: str,
    cache_dir: str | os.PathLike[str] | None,
    storage_options: Mapping[str, Any],
) -> str | None:
    """The local file holding ``url``: itself when local, its cached copy with a
    ``cache_dir`` (downloaded now if missing), else None."""
    if not is_remote(url):
        return local_path(url)
    if cache_dir is None:
        return None
    cache = os.path.expanduser(os.fspath(cache_dir))
    os.makedirs(cache, exist_ok=True)
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    base = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[:80]
    target = os.path.join(cache, f"{digest}-{base}")
    if os.path.isfile(target):
        return target
    fs, path = filesystem(url, storage_options)
    tmp = temp_name(target)
    try:
        with fs.open(path, "rb", block_size=0) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, _COPY_CHUNK)
        os.replace(tmp, target)  # atomic: concurrent readers see the whole file or none
    except BaseException:
        remove(tmp)
        raise
    return target


def open_stream(
    url: str,
    cache_dir: str | os.PathLike[str] | None,
    storage_options: Mapping[str, Any],
) -> IO[bytes]:
    """``url`` opened for one sequential pass (a stream when remote and not cached)."""
    local = cached(url, cache_dir, storage_options)
    if local is not None:
        return open(local, "rb")
    fs, path = filesystem(url, storage_options)
    # block_size=0 asks for a plain stream: http servers without range support work too.
    return fs.open(path, "rb", block_size=0)  # type: ignore[no-any-return]


def open_random(url: str, storage_options: Mapping[str, Any]) -> IO[bytes]:
    """The remote ``url`` opened for seek + read (byte-range requests); for a local or
    cached copy, open the path :func:`cached` gives."""
    fs, path = filesystem(url, storage_options)
    return fs.open(path, "rb")  # type: ignore[no-any-return]


def upload(local: str, url: str, storage_options: Mapping[str, Any]) -> None:
    """Copy the local file ``local`` to ``url`` (one object: it appears whole or not at all)."""
    fs, path = filesystem(url, storage_options)
    fs.put_file(local, path)


def temp_name(final: str) -> str:
    """A fresh temporary name beside ``final``, marked with this process's pid.

    >>> temp_name("/d/out.lmdb").startswith("/d/.out.lmdb.stoker-tmp-")
    True
    """
    head, base = os.path.split(final)
    return os.path.join(head, f".{base}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def sweep_stale(final: str) -> list[str]:
    """Remove temporary files and folders of ``final`` left by processes that died.

    Returns:
        The paths removed.
    """
    head, base = os.path.split(final)
    prefix = f".{base}{_TMP_MARK}"
    removed = []
    try:
        names = os.listdir(head or ".")
    except FileNotFoundError:
        return []
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].split("-", 1)[0]
        if pid_text.isdigit() and pid_alive(int(pid_text)):
            continue
        path = os.path.join(head, name)
        remove(path)
        removed.append(path)
    return removed


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """Turn an OSError raised while writing ``path`` (or its temporary file) into one of the
    same kind whose message names ``path`` and the fix: a read-only folder, a full disk or
    a file-size limit otherwise say no more than their errno."""
    try:
        yield
    except OSError as exc:
        if exc.errno is None or path in str(exc):
            raise
        raise OSError(
            exc.errno,
            f"cannot write {path!r} ({exc.strerror or exc}); pick a folder that is writable "
            "and has free space",
            exc.filename,
        ) from exc


def remove(path: str) -> None:
    """Remove the file or directory ``path``, if it is there (a failure is not raised)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        if os.path.lexists(path):  # a read-only folder refuses even a missing name (EROFS)
            raise
