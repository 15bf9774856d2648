"""Download, verify and extract dataset archives: urllib, MD5, and a tar extractor that refuses
members that would land outside the target folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tarfile
import urllib.request

_logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
_TIMEOUT_S = 60.0
"""Seconds a connection or a single read may stall before the download fails."""


def md5sum(path: str | os.PathLike[str]) -> str:
    """The hex MD5 digest of the file at ``path``."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_integrity(path: str | os.PathLike[str], md5: str | None = None) -> bool:
    """Whether ``path`` is a file and, when ``md5`` is given, has that digest."""
    if not os.path.isfile(path):
        return False
    return md5 is None or md5sum(path) == md5


def download_url(
    url: str, path: str, md5: str | None = None, timeout_s: float = _TIMEOUT_S
) -> None:
    """Download ``url`` to ``path`` (via a temporary name), checking ``md5`` when given.

    Raises:
        RuntimeError: when the download's MD5 differs from ``md5`` (the file is removed).
        OSError: when the server cannot be reached or the transfer fails (urllib's error,
            with the URL in the message).
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    part = path + ".part"
    digest = hashlib.md5(usedforsecurity=False)
    _logger.info("downloading %s to %s", url, path)
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "stoker"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response, open(part, "wb") as f:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                digest.update(chunk)
                f.write(chunk)
    except OSError as exc:
        _remove(part)
        raise _with_url(exc, url) from exc
    except BaseException:
        _remove(part)
        raise
    found = digest.hexdigest()
    if md5 is not None and found != md5:
        _remove(part)
        raise RuntimeError(
            f"checksum mismatch for {url}: expected MD5 {md5}, got {found}. The download is "
            "corrupt or the server sent another file; retry, or check the URL and MD5."
        )
    os.replace(part, path)


def _with_url(exc: OSError, url: str) -> OSError:
    """An error of ``exc``'s type (or ``OSError``) whose message names ``url``."""
    msg = f"could not download {url}: {exc}. Check the URL and the network, then retry."
    try:
        return type(exc)(msg)
    except TypeError:  # e.g. HTTPError, whose constructor takes five arguments
        return OSError(msg)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def safe_extract_tar(archive: str, target: str) -> None:
    """Extract the tar ``archive`` into ``target``, refusing unsafe members.

    Raises:
        RuntimeError: for a member with an absolute path or ``..``, a link pointing outside
            ``target``, or a device/FIFO; nothing is extracted then.
    """
    root = os.path.realpath(target)
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for m in members:
            _check_member(m, root, archive)
        os.makedirs(root, exist_ok=True)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, members=members, filter="data")
        else:  # pragma: no cover - Python without PEP 706 filters; members already checked
            tar.extractall(root, members=members)


def _check_member(m: tarfile.TarInfo, root: str, archive: str) -> None:
    name = m.name
    parts = name.replace("\\", "/").split("/")
    bad = None
    if os.path.isabs(name) or name.startswith(("/", "\\")):
        bad = "has an absolute path"
    elif ".." in parts:
        bad = "contains '..'"
    elif not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
        bad = "is a device or FIFO"
    elif m.issym() or m.islnk():
        base = os.path.dirname(os.path.join(root, name)) if m.issym() else root
        dest = os.path.realpath(os.path.join(base, m.linkname))
        if os.path.isabs(m.linkname) or os.path.commonpath([root, dest]) != root:
            bad = f"links outside the target folder ({m.linkname!r})"
    if bad is None:
        dest = os.path.realpath(os.path.join(root, name))
        if os.path.commonpath([root, dest]) != root:
            bad = "would be written outside the target folder"
    if bad is not None:
        raise RuntimeError(
            f"refusing to extract {archive!r}: member {name!r} {bad}. The archive is not a "
            "trusted dataset archive; download it again from the official source."
        )


def download_and_extract_archive(
    url: str,
    download_root: str,
    filename: str,
    md5: str | None = None,
    extract_root: str | None = None,
) -> None:
    """Download ``url`` to ``download_root/filename`` (unless verified there) and extract it.

    Raises:
        RuntimeError: for a checksum mismatch or an unsafe archive.
        OSError: when the download fails.
    """
    archive = os.path.join(os.path.expanduser(download_root), filename)
    if check_integrity(archive, md5):
        _logger.info("using verified archive %s", archive)
    else:
        download_url(url, archive, md5)
    safe_extract_tar(archive, extract_root or os.path.dirname(archive))
