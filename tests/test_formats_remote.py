"""Remote shards and LMDB files through fsspec: memory://, a local HTTP server, and a real
S3-compatible server (moto) on loopback reached through ``storage_options``, with 2 workers
forked, spawned and started by a forkserver."""

from __future__ import annotations

import functools
import http.server
import os
import pickle
import socket
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

fsspec = pytest.importorskip("fsspec")

import stoker  # noqa: E402
from stoker.formats import (  # noqa: E402
    LMDBDataset,
    LMDBWriter,
    ShardDataset,
    ShardIterable,
    ShardWriter,
    inspect,
)

_SERVER_STOP_S = 10.0


def write_numbers(
    pattern: str, n: int, maxcount: int, storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Shards of samples (an int16 pair as .npy, i as .cls)."""
    with ShardWriter(
        pattern, maxcount=maxcount, fields=["npy", "cls"], storage_options=storage_options
    ) as w:
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
def s3_bucket() -> Iterator[tuple[str, dict[str, Any]]]:
    """A moto S3 server on 127.0.0.1 with bucket 'stoker': (bucket URL, storage_options).

    The endpoint and credentials are given only in the storage_options (neither
    ``fsspec.config.conf`` nor AWS_* variables), so whatever lacks them misses the server.
    Skipped without moto/s3fs.
    """
    moto_server = pytest.importorskip("moto.server", reason="needs moto[server]")
    pytest.importorskip("s3fs", reason="needs s3fs")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "key": "testing",
        "secret": "testing",
    }
    try:
        fsspec.filesystem("s3", **options).mkdir("stoker")  # the instance the tests reuse
        yield "s3://stoker", options
    finally:
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
def test_s3_shards_with_two_workers(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    """Shards on the S3-compatible server: written, then read with 2 workers, both readers."""
    bucket, options = s3_bucket
    shards = write_numbers(f"{bucket}/train/s-%03d.tar", 24, maxcount=5, storage_options=options)
    assert len(shards) == 5
    # Byte-range reads.
    ds = ShardDataset(f"{bucket}/train/s-{{000..004}}.tar", storage_options=options)
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list)
    got = [y for batch in loader for _, y in batch]
    assert got == list(range(24))
    it = ShardIterable(f"{bucket}/train/", buffer_size=4, storage_options=options)
    streamed = [int(y) for _, ys in stoker.DataLoader(it, batch_size=3, num_workers=2) for y in ys]
    assert sorted(streamed) == list(range(24))


@pytest.mark.multiprocess
def test_s3_storage_options_reach_spawned_workers(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    """Workers started by spawn and by a forkserver reach the server through the dataset's
    storage_options alone: no fsspec config or AWS_* variable names it (see s3_bucket)."""
    bucket, options = s3_bucket
    write_numbers(f"{bucket}/spawn/s-%03d.tar", 10, maxcount=4, storage_options=options)
    ds = ShardDataset(f"{bucket}/spawn/", storage_options=options)
    loader = stoker.DataLoader(
        ds, batch_size=4, num_workers=2, collate_fn=list, multiprocessing_context="spawn"
    )
    assert [y for batch in loader for _, y in batch] == list(range(10))
    it = ShardIterable(f"{bucket}/spawn/", buffer_size=0, storage_options=options)
    loader = stoker.DataLoader(
        it, batch_size=3, num_workers=2, multiprocessing_context="forkserver"
    )
    assert sorted(int(y) for _, ys in loader for y in ys) == list(range(10))


def test_readers_pickle_with_storage_options(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    """ShardDataset and ShardIterable keep their storage_options through pickle and read
    with them after loading."""
    bucket, options = s3_bucket
    write_numbers(f"{bucket}/pickle/s-%03d.tar", 6, maxcount=4, storage_options=options)
    ds = pickle.loads(pickle.dumps(ShardDataset(f"{bucket}/pickle/", storage_options=options)))
    assert ds.storage_options == options
    assert ds[5][1] == 5
    ds._files().close()
    it = ShardIterable(
        f"{bucket}/pickle/", shuffle_shards=False, buffer_size=0, storage_options=options
    )
    it = pickle.loads(pickle.dumps(it))
    assert it.storage_options == options
    assert [y for _, y in it] == list(range(6))


def test_s3_lmdb_and_inspect_with_storage_options(
    s3_bucket: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """LMDBDataset downloads and inspect() describes S3 objects through storage_options."""
    bucket, options = s3_bucket
    local = tmp_path / "a.lmdb"
    with LMDBWriter(local) as w:
        w.write((b"payload", 3))
    fsspec.filesystem("s3", **options).put_file(str(local), "stoker/lmdb/a.lmdb")
    ds = LMDBDataset(f"{bucket}/lmdb/a.lmdb", cache_dir=tmp_path / "c", storage_options=options)
    assert ds[0] == (b"payload", 3)
    write_numbers(f"{bucket}/inspect/s-%03d.tar", 7, maxcount=4, storage_options=options)
    text = inspect(f"{bucket}/inspect/", storage_options=options)
    assert "2 tar shard(s)" in text and "samples: 7" in text


def test_storage_options_must_be_a_mapping_with_str_keys(tmp_path: Path) -> None:
    """A wrong storage_options raises TypeError naming the fix and never echoing values;
    for a local path valid options are ignored."""
    pattern = str(tmp_path / "s-%03d.tar")
    write_numbers(pattern, 3, maxcount=4, storage_options={"anon": True})
    assert ShardDataset(str(tmp_path), storage_options={"anon": True})[2][1] == 2
    with pytest.raises(TypeError, match="must be a mapping") as info:
        ShardIterable(str(tmp_path), storage_options=[("secret", "hunter2")])  # type: ignore[arg-type]
    assert "hunter2" not in str(info.value)
    with pytest.raises(TypeError, match="keys must be str"):
        ShardWriter(pattern, storage_options={1: "x"})  # type: ignore[dict-item]
