"""Remote shards and LMDB files through fsspec: memory://, a local HTTP server, and a real
S3-compatible server (moto) on loopback, with 2 workers."""

from __future__ import annotations

import functools
import http.server
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

fsspec = pytest.importorskip("fsspec")

import stoker  # noqa: E402
from stoker.formats import LMDBDataset, LMDBWriter, ShardDataset, ShardIterable, ShardWriter  # noqa: E402

_SERVER_STOP_S = 10.0


def write_numbers(pattern: str, n: int, maxcount: int) -> list[str]:
    """Shards of samples (an int16 pair as .npy, i as .cls)."""
    with ShardWriter(pattern, maxcount=maxcount, fields=["npy", "cls"]) as w:
        for i in range(n):
            w.write((np.array([i, -i], dtype=np.int16), i))
    return w.shards


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A folder served by http.server on 127.0.0.1 in a thread; (base URL, folder)."""
    pytest.importorskip("aiohttp", reason="fsspec's http:// needs aiohttp")
    root = tmp_path_factory.mktemp("www")
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    (root / "warm").write_bytes(b"x")
    fsspec.filesystem("http").cat_file(f"{base}/warm")  # starts fsspec's IO thread now
    yield base, root
    server.shutdown()
    server.server_close()
    thread.join(_SERVER_STOP_S)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files without logging every request to stderr."""

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def s3_bucket() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with bucket 'stoker'; skipped without moto/s3fs."""
    moto_server = pytest.importorskip("moto.server", reason="needs moto[server]")
    pytest.importorskip("s3fs", reason="needs s3fs")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = dict(fsspec.config.conf.get("s3", {}))
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    old_env = {k: os.environ.get(k) for k in (*env, "AWS_DEFAULT_REGION")}
    os.environ.update(env, AWS_DEFAULT_REGION="us-east-1")
    fsspec.config.conf["s3"] = {"endpoint_url": endpoint, "anon": False}
    try:
        fs = fsspec.filesystem("s3")
        fs.mkdir("stoker")
        yield "s3://stoker"
    finally:
        fsspec.config.conf["s3"] = saved
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def test_memory_shards_roundtrip() -> None:
    """ShardWriter uploads to memory://; both readers read the samples back in order."""
    shards = write_numbers("memory://mem/s-%03d.tar", 9, maxcount=4)
    assert shards[0] == "memory://mem/s-000.tar" and len(shards) == 3
    ds = ShardDataset("memory://mem/s-{000..002}.tar")
    assert [ds[i][1] for i in range(9)] == list(range(9))
    np.testing.assert_array_equal(ds[8][0], [8, -8])
    it = ShardIterable("memory://mem/", shuffle_shards=False, buffer_size=0)
    assert [y for _, y in it] == list(range(9))


def test_memory_lmdb_goes_through_cache(tmp_path: Path) -> None:
    """A remote LMDB file is downloaded once into cache_dir and read locally."""
    local = tmp_path / "a.lmdb"
    with LMDBWriter(local) as w:
        w.write((b"payload", 3))
    fsspec.filesystem("memory").pipe_file("/mem/a.lmdb", local.read_bytes())
    cache = tmp_path / "cache"
    ds = LMDBDataset("memory://mem/a.lmdb", cache_dir=cache)
    assert ds[0] == (b"payload", 3)
    assert len(os.listdir(cache)) == 1 and ds.path.startswith(str(cache))


def test_http_streaming_and_cached_map_reads(http_root: tuple[str, Path], tmp_path: Path) -> None:
    """From a local HTTP server: streamed iterable reads, and map reads through a cache."""
    base, root = http_root
    write_numbers(str(root / "h-%02d.tar"), 10, maxcount=4)
    urls = f"{base}/h-{{00..02}}.tar"
    it = ShardIterable(urls, shuffle_shards=False, buffer_size=0)
    assert [y for _, y in it] == list(range(10))
    ds = ShardDataset(urls, cache_dir=tmp_path / "c")
    assert [ds[i][1] for i in (9, 0, 5)] == [9, 0, 5]
    assert len(os.listdir(tmp_path / "c")) == 3
    ds._files().close()


@pytest.mark.multiprocess
def test_s3_shards_with_two_workers(s3_bucket: str) -> None:
    """Shards on the S3-compatible server: written, then read with 2 workers, both readers."""
    shards = write_numbers(f"{s3_bucket}/train/s-%03d.tar", 24, maxcount=5)
    assert len(shards) == 5
    ds = ShardDataset(f"{s3_bucket}/train/s-{{000..004}}.tar")  # byte-range reads
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list)
    got = [y for batch in loader for _, y in batch]
    assert got == list(range(24))
    it = ShardIterable(f"{s3_bucket}/train/", buffer_size=4)
    streamed = [int(y) for _, ys in stoker.DataLoader(it, batch_size=3, num_workers=2) for y in ys]
    assert sorted(streamed) == list(range(24))
