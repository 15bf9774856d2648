"""Tests of CIFAR10/100: reading the official batch layout, download over loopback, safety."""

from __future__ import annotations

import hashlib
import http.server
import io
import pickle
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from PIL import Image

from stoker.vision import CIFAR10, CIFAR100
from stoker.vision import transforms as T
from stoker.vision._download import safe_extract_tar

_SERVE_TIMEOUT_S = 10.0


def _batch(n: int, seed: int, labels_key: str = "labels") -> bytes:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    return pickle.dumps({"data": data, labels_key: [int(x) for x in rng.integers(0, 10, n)]})


def _tiny_cifar10() -> tuple[bytes, type[CIFAR10]]:
    """A tar.gz in the official layout (2 images per batch) and a subclass with its MD5s."""
    files = {f"data_batch_{i}": _batch(2, i) for i in range(1, 6)}
    files["test_batch"] = _batch(2, 9)
    files["batches.meta"] = pickle.dumps({"label_names": [f"c{i}" for i in range(10)]})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    md5 = {name: hashlib.md5(data).hexdigest() for name, data in files.items()}

    class Tiny(CIFAR10):
        train_list: ClassVar[list[list[str]]] = [
            [f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)
        ]
        test_list: ClassVar[list[list[str]]] = [["test_batch", md5["test_batch"]]]
        meta: ClassVar[dict[str, str]] = {
            "filename": "batches.meta",
            "key": "label_names",
            "md5": md5["batches.meta"],
        }

    return buf.getvalue(), Tiny


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, bytes]]]:
    """An HTTP server on 127.0.0.1 serving the bytes put in the returned dict, by path."""
    content: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = content.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", content
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(_SERVE_TIMEOUT_S)
        assert not thread.is_alive()


def test_download_checksum_extract_and_read(tmp_path: Path, server) -> None:
    """download=True fetches, verifies and extracts; samples are (PIL RGB 32x32, int)."""
    base, content = server
    archive, Tiny = _tiny_cifar10()
    content["/cifar.tgz"] = archive
    md5 = hashlib.md5(archive).hexdigest()
    train = Tiny(tmp_path, train=True, download=True, url=f"{base}/cifar.tgz", md5=md5)
    assert len(train) == 10 and train.data.shape == (10, 32, 32, 3)
    assert train.classes[:2] == ["c0", "c1"] and train.class_to_idx["c3"] == 3
    img, target = train[0]
    assert isinstance(img, Image.Image) and img.size == (32, 32) and img.mode == "RGB"
    assert isinstance(target, int)
    test = Tiny(tmp_path, train=False, transform=T.ToTensor())
    x, _ = test[1]
    assert x.shape == (3, 32, 32) and x.dtype == np.float32 and len(test) == 2
    del content["/cifar.tgz"]  # already there: no second download
    Tiny(tmp_path, download=True, url=f"{base}/cifar.tgz", md5=md5)


def test_bad_checksum_is_refused(tmp_path: Path, server) -> None:
    """A download whose MD5 differs raises RuntimeError naming both digests; no file stays."""
    base, content = server
    archive, Tiny = _tiny_cifar10()
    content["/cifar.tgz"] = archive
    with pytest.raises(RuntimeError, match=r"checksum mismatch.*expected MD5 0+"):
        Tiny(tmp_path, download=True, url=f"{base}/cifar.tgz", md5="0" * 32)
    assert list(tmp_path.iterdir()) == []


def test_unreachable_download_names_the_url(tmp_path: Path, server) -> None:
    """A 404 raises OSError naming the URL."""
    base, _ = server
    with pytest.raises(OSError, match=r"could not download .*missing.tgz"):
        CIFAR10(tmp_path, download=True, url=f"{base}/missing.tgz")


def test_missing_files_say_how_to_fix(tmp_path: Path) -> None:
    """Without the files and without download, RuntimeError names the folder and the fix."""
    with pytest.raises(RuntimeError, match=r"cifar-10-batches-py.*download=True"):
        CIFAR10(tmp_path)
    with pytest.raises(RuntimeError, match=r"cifar-100-python"):
        CIFAR100(tmp_path, train=False)


def test_corrupted_batch_is_detected(tmp_path: Path, server) -> None:
    """A batch file changed after extraction fails the MD5 check instead of being unpickled."""
    base, content = server
    archive, Tiny = _tiny_cifar10()
    content["/c.tgz"] = archive
    Tiny(tmp_path, download=True, url=f"{base}/c.tgz", md5=hashlib.md5(archive).hexdigest())
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"tampered")
    with pytest.raises(RuntimeError, match=r"not found or corrupted"):
        Tiny(tmp_path)


def test_cifar100_reads_fine_labels(tmp_path: Path) -> None:
    """CIFAR100 reads 'fine_labels' and 'fine_label_names' from its own layout."""
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    files = {
        "train": _batch(3, 1, "fine_labels"),
        "test": _batch(2, 2, "fine_labels"),
        "meta": pickle.dumps({"fine_label_names": [f"f{i}" for i in range(100)]}),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    md5 = {name: hashlib.md5(data).hexdigest() for name, data in files.items()}

    class Tiny100(CIFAR100):
        train_list: ClassVar[list[list[str]]] = [["train", md5["train"]]]
        test_list: ClassVar[list[list[str]]] = [["test", md5["test"]]]
        meta: ClassVar[dict[str, str]] = {
            "filename": "meta",
            "key": "fine_label_names",
            "md5": md5["meta"],
        }

    ds = Tiny100(tmp_path)
    assert len(ds) == 3 and len(ds.classes) == 100
    assert ds.targets == pickle.loads(files["train"])["fine_labels"]


@pytest.mark.parametrize("member", ["../evil", "/abs/evil", "a/../../evil"])
def test_unsafe_archive_members_are_refused(tmp_path: Path, member: str) -> None:
    """Tar members with absolute paths or '..' are refused and nothing is written."""
    archive = tmp_path / "bad.tar"
    with tarfile.open(archive, "w") as tar:
        ok = tarfile.TarInfo("fine.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        info = tarfile.TarInfo(member)
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match=r"refusing to extract"):
        safe_extract_tar(str(archive), str(out))
    assert not out.exists() and not (tmp_path / "evil").exists()


def test_symlink_escaping_the_target_is_refused(tmp_path: Path) -> None:
    """A symlink member pointing outside the target folder is refused."""
    archive = tmp_path / "link.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("link")
        info.type = tarfile.SYMTYPE
        info.linkname = "../../etc/passwd"
        tar.addfile(info)
    with pytest.raises(RuntimeError, match=r"links outside"):
        safe_extract_tar(str(archive), str(tmp_path / "out"))
