"""Tests of dpcourse.data: download with md5 checks, the IDX reader, the synthetic set.

The download tests run the real urllib code against a local HTTP server on
127.0.0.1 (a thread in this process) that serves small IDX files built here;
nothing touches the internet.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from dpcourse import data
from dpcourse.data import DataError

# Published md5 sums of the two real label files (Zalando Research's README).
PUBLISHED_MD5 = {
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}


# --------------------------------------------------------------------------
# Helpers: IDX bytes and a local HTTP server


def idx_bytes(array: np.ndarray) -> bytes:
    """Raw IDX encoding of a uint8 array (magic 0x0000 08 <ndim>, big-endian dims)."""
    assert array.dtype == np.uint8
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(">" + "I" * array.ndim, *array.shape)
    return header + array.tobytes()


def gz(raw: bytes) -> bytes:
    return gzip.compress(raw, mtime=0)


def md5_hex(raw: bytes) -> str:
    return hashlib.md5(raw).hexdigest()


def small_train_files(n: int = 40) -> dict[str, bytes]:
    """Fashion-MNIST-shaped training files with ``n`` examples, gzip-compressed."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    return {
        "train-images-idx3-ubyte.gz": gz(idx_bytes(images)),
        "train-labels-idx1-ubyte.gz": gz(idx_bytes(labels)),
    }


class LocalServer:
    """An HTTP server on 127.0.0.1 serving ``routes`` ({url path: bytes}).

    ``lie_about_length`` holds paths for which the server announces the full
    Content-Length but sends only half of the bytes and closes (a transfer
    cut off mid-way). Every requested path is logged in ``requests``.
    """

    def __init__(self):
        self.routes: dict[str, bytes] = {}
        self.lie_about_length: set[str] = set()
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                server.requests.append(self.path)
                body = server.routes.get(self.path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.path in server.lie_about_length:
                    self.wfile.write(body[: len(body) // 2])
                    self.close_connection = True
                else:
                    self.wfile.write(body)

            def log_message(self, *args):  # keep pytest output clean
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def mirror(self, folder: str) -> str:
        return f"{self.base}/{folder}/"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def server(monkeypatch):
    # A proxy from the environment would intercept 127.0.0.1 requests.
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    srv = LocalServer()
    yield srv
    srv.close()


def leftovers(folder: Path) -> list[str]:
    """Every entry in the cache folder, hidden temporary files included."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


NAME = "train-labels-idx1-ubyte.gz"
GOOD = gz(idx_bytes((np.arange(50) % 10).astype(np.uint8)))


# --------------------------------------------------------------------------
# download()


def test_download_fetches_and_verifies(server, tmp_path):
    server.routes[f"/a/{NAME}"] = GOOD
    path = data.download(NAME, tmp_path, mirrors=(server.mirror("a"),), md5={NAME: md5_hex(GOOD)}, timeout_s=5)
    assert path == tmp_path / NAME
    assert path.read_bytes() == GOOD
    assert data.md5_of(path) == md5_hex(GOOD)
    assert leftovers(tmp_path) == [NAME]  # no temporary file left behind
    np.testing.assert_array_equal(data.read_idx(path), np.arange(50) % 10)


def test_download_uses_a_verified_cached_file_without_network(server, tmp_path):
    (tmp_path / NAME).write_bytes(GOOD)
    data.download(NAME, tmp_path, mirrors=(server.mirror("a"),), md5={NAME: md5_hex(GOOD)}, timeout_s=5)
    assert server.requests == []


def test_second_location_is_tried_when_the_first_fails(server, tmp_path):
    server.routes[f"/b/{NAME}"] = GOOD  # nothing under /a/: 404
    path = data.download(
        NAME, tmp_path, mirrors=(server.mirror("a"), server.mirror("b")), md5={NAME: md5_hex(GOOD)}, timeout_s=5
    )
    assert path.read_bytes() == GOOD
    assert server.requests == [f"/a/{NAME}", f"/b/{NAME}"]
    assert leftovers(tmp_path) == [NAME]


def test_second_location_is_tried_when_the_first_has_wrong_bytes(server, tmp_path):
    server.routes[f"/a/{NAME}"] = GOOD[:-10]  # truncated copy on the first mirror
    server.routes[f"/b/{NAME}"] = GOOD
    path = data.download(
        NAME, tmp_path, mirrors=(server.mirror("a"), server.mirror("b")), md5={NAME: md5_hex(GOOD)}, timeout_s=5
    )
    assert path.read_bytes() == GOOD


def _assert_clear_failure(err: DataError, urls: list[str], folder: Path):
    message = str(err)
    assert NAME in message
    for url in urls:
        assert url in message, f"the error must list every location tried: {url}"
    assert str(folder) in message, "the error must name the cache folder"
    assert "synthetic" in message  # and say how to carry on without the network


def test_truncated_download_is_an_error_and_leaves_nothing(server, tmp_path):
    server.routes[f"/a/{NAME}"] = GOOD[: len(GOOD) // 2]
    with pytest.raises(DataError) as err:
        data.download(NAME, tmp_path, mirrors=(server.mirror("a"),), md5={NAME: md5_hex(GOOD)}, timeout_s=5)
    _assert_clear_failure(err.value, [server.mirror("a") + NAME], tmp_path)
    assert "md5" in str(err.value)
    assert leftovers(tmp_path) == []  # not the file, not a .part


def test_transfer_cut_off_midway_is_an_error_and_leaves_nothing(server, tmp_path):
    # The server promises len(GOOD) bytes and closes after half of them.
    server.routes[f"/a/{NAME}"] = GOOD
    server.lie_about_length.add(f"/a/{NAME}")
    with pytest.raises(DataError) as err:
        data.download(NAME, tmp_path, mirrors=(server.mirror("a"),), md5={NAME: md5_hex(GOOD)}, timeout_s=5)
    _assert_clear_failure(err.value, [server.mirror("a") + NAME], tmp_path)
    assert leftovers(tmp_path) == []


def test_wrong_md5_everywhere_is_an_error_and_leaves_nothing(server, tmp_path):
    server.routes[f"/a/{NAME}"] = GOOD
    server.routes[f"/b/{NAME}"] = GOOD
    wrong = "0" * 32
    mirrors = (server.mirror("a"), server.mirror("b"))
    with pytest.raises(DataError) as err:
        data.download(NAME, tmp_path, mirrors=mirrors, md5={NAME: wrong}, timeout_s=5)
    _assert_clear_failure(err.value, [m + NAME for m in mirrors], tmp_path)
    assert wrong in str(err.value) and md5_hex(GOOD) in str(err.value)
    assert leftovers(tmp_path) == []


def test_all_locations_missing_names_each_failure(server, tmp_path):
    mirrors = (server.mirror("a"), server.mirror("b"))
    with pytest.raises(DataError) as err:
        data.download(NAME, tmp_path, mirrors=mirrors, md5={NAME: md5_hex(GOOD)}, timeout_s=5)
    _assert_clear_failure(err.value, [m + NAME for m in mirrors], tmp_path)
    for mirror in mirrors:  # each location with its own failure
        line = next(line for line in str(err.value).splitlines() if (mirror + NAME) in line)
        assert "HTTP Error 404" in line, line
    assert leftovers(tmp_path) == []


def test_corrupt_cached_file_is_replaced(server, tmp_path):
    (tmp_path / NAME).write_bytes(b"not the right bytes")
    server.routes[f"/a/{NAME}"] = GOOD
    path = data.download(NAME, tmp_path, mirrors=(server.mirror("a"),), md5={NAME: md5_hex(GOOD)}, timeout_s=5)
    assert path.read_bytes() == GOOD
    assert server.requests == [f"/a/{NAME}"]


def test_unknown_file_name_is_a_key_error(tmp_path):
    with pytest.raises(KeyError):
        data.download("no-such-file.gz", tmp_path, mirrors=())


def test_data_dir_environment_moves_the_cache(server, tmp_path, monkeypatch):
    moved = tmp_path / "elsewhere" / "cache"
    monkeypatch.setenv(data.DATA_DIR_ENV, str(moved))
    assert data.cache_dir() == moved
    server.routes[f"/a/{NAME}"] = GOOD
    path = data.download(NAME, mirrors=(server.mirror("a"),), md5={NAME: md5_hex(GOOD)}, timeout_s=5)
    assert path == moved / NAME and path.read_bytes() == GOOD


def test_default_cache_is_under_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data.cache_dir() == tmp_path / ".cache" / "dpcourse" / "fashion-mnist"


# --------------------------------------------------------------------------
# load_fashion_mnist(): real, auto fallback, synthetic


def test_load_real_data_through_the_download_path(server, tmp_path, monkeypatch):
    files = small_train_files(40)
    for name, raw in files.items():
        server.routes[f"/a/{name}"] = raw
        # load_fashion_mnist checks against data.MD5; point it at the test files.
        monkeypatch.setitem(data.MD5, name, md5_hex(raw))
    ds = data.load_fashion_mnist("real", directory=tmp_path, mirrors=(server.mirror("a"),))
    assert ds.source == "real"
    assert ds.images.shape == (40, 784) and ds.images.dtype == np.float32
    assert ds.labels.shape == (40,) and ds.labels.dtype == np.int32
    assert sorted(np.bincount(ds.labels)) == [4] * 10


def test_real_source_raises_when_unreachable(server, tmp_path):
    with pytest.raises(DataError, match="Could not download"):
        data.load_fashion_mnist("real", directory=tmp_path, mirrors=(server.mirror("none"),))
    assert leftovers(tmp_path) == []


def test_auto_source_falls_back_to_synthetic_with_a_note(server, tmp_path):
    ds = data.load_fashion_mnist("auto", limit=100, directory=tmp_path, mirrors=(server.mirror("none"),))
    assert ds.source == "synthetic"
    assert "Real data unavailable" in ds.note and "synthetic" in ds.note
    assert data.TRAIN_FILES[0] in ds.note  # says which file could not be had
    assert ds.images.shape == (100, 784)


def test_synthetic_from_the_environment_never_touches_the_network(server, tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, "synthetic")
    ds = data.load_fashion_mnist(limit=50, directory=tmp_path, mirrors=(server.mirror("a"),))
    assert ds.source == "synthetic" and data.DATA_ENV in ds.note
    assert server.requests == []


def test_unknown_source_is_an_error():
    with pytest.raises(ValueError, match="auto, real or synthetic"):
        data.load_fashion_mnist("imagenet")


def test_synthetic_set_has_fashion_mnist_shapes_and_classes():
    images, labels = data.synthetic_images(200, seed=0)
    assert images.shape == (200, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (200,) and labels.dtype == np.uint8
    assert np.bincount(labels).tolist() == [20] * 10  # balanced, all 10 classes
    assert images.min() >= 0 and images.max() > 128  # uses the uint8 range
    again, _ = data.synthetic_images(200, seed=0)
    np.testing.assert_array_equal(images, again)  # deterministic


def test_synthetic_set_is_learnable():
    # Nearest class centroid, fitted on 2,000 examples and tested on 1,000
    # others, must beat chance (10%) by far, otherwise the course's loss
    # curves on synthetic data would show nothing. It reaches about 99% today;
    # 50% leaves room for a harder generator without letting a broken
    # (unlearnable) one pass.
    images, labels = data.synthetic_images(3000, seed=0)
    x, y = data.prepare(images, labels)
    x_fit, y_fit, x_test, y_test = x[:2000], y[:2000], x[2000:], y[2000:]
    centroids = np.stack([x_fit[y_fit == c].mean(axis=0) for c in range(10)])
    distances = ((x_test[:, None, :] - centroids[None]) ** 2).sum(-1)
    accuracy = (distances.argmin(axis=1) == y_test).mean()
    assert accuracy > 0.5


# --------------------------------------------------------------------------
# read_idx() on real and on broken bytes


@pytest.mark.parametrize("name, count", [("train-labels-idx1-ubyte.gz", 60_000), ("t10k-labels-idx1-ubyte.gz", 10_000)])
def test_real_label_files(shared_data_dir, name, count):
    path = shared_data_dir / name
    assert data.md5_of(path) == PUBLISHED_MD5[name] == data.MD5[name]
    labels = data.read_idx(path)
    assert labels.shape == (count,) and labels.dtype == np.uint8
    assert np.bincount(labels, minlength=10).tolist() == [count // 10] * 10


def test_real_label_file_passes_the_download_check_from_the_cache(shared_data_dir, tmp_path):
    # A learner who copies the published file into the cache by hand gets it
    # accepted without any network access (mirrors=()).
    (tmp_path / NAME).write_bytes((shared_data_dir / NAME).read_bytes())
    assert data.download(NAME, tmp_path, mirrors=()) == tmp_path / NAME


def test_read_idx_reads_plain_and_gzip(tmp_path):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a.idx").write_bytes(idx_bytes(array))
    (tmp_path / "a.idx.gz").write_bytes(gz(idx_bytes(array)))
    np.testing.assert_array_equal(data.read_idx(tmp_path / "a.idx"), array)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "a.idx.gz"), array)


def test_read_idx_rejects_a_truncated_file(tmp_path):
    raw = idx_bytes(np.zeros((10, 28, 28), np.uint8))
    path = tmp_path / "short.gz"
    path.write_bytes(gz(raw[:-100]))
    with pytest.raises(DataError, match="truncated") as err:
        data.read_idx(path)
    assert str(path) in str(err.value)


def test_read_idx_rejects_a_cut_gzip_stream(tmp_path):
    path = tmp_path / "cut.gz"
    path.write_bytes(gz(idx_bytes(np.zeros((10, 28, 28), np.uint8)))[:40])
    with pytest.raises(DataError, match="download again"):
        data.read_idx(path)


def test_read_idx_rejects_a_non_idx_file(tmp_path):
    path = tmp_path / "page.gz"
    path.write_bytes(gz(b"<html>404 not found</html>"))
    with pytest.raises(DataError, match="not an IDX file"):
        data.read_idx(path)


# --------------------------------------------------------------------------
# prepare() and stacked_batches()


def _labelled_images(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Images whose pixel value encodes the label, to check pairs stay together."""
    labels = (np.arange(n) % 10).astype(np.uint8)
    images = np.broadcast_to((labels * 25).astype(np.uint8)[:, None, None], (n, 28, 28)).copy()
    images[0, 0, 0] = 255  # the scale's top end
    return images, labels


def test_prepare_scales_flattens_and_keeps_pairs():
    images, labels = _labelled_images(50)
    x, y = data.prepare(images, labels, seed=0)
    assert x.shape == (50, 784) and x.dtype == np.float32
    assert y.shape == (50,) and y.dtype == np.int32
    assert x.min() == 0.0 and x.max() == 1.0  # 255 -> exactly 1.0
    # Pixel 1 still encodes each example's label after the shuffle.
    np.testing.assert_allclose(x[:, 1], y * 25 / 255.0, rtol=1e-6)  # float32 division


def test_prepare_shuffle_is_deterministic_and_seeded():
    images, labels = _labelled_images(200)
    _, y0 = data.prepare(images, labels, seed=0)
    _, y0_again = data.prepare(images, labels, seed=0)
    _, y1 = data.prepare(images, labels, seed=1)
    np.testing.assert_array_equal(y0, y0_again)
    assert not np.array_equal(y0, y1)
    assert not np.array_equal(y0, labels)  # it did shuffle
    assert sorted(y0.tolist()) == sorted(labels.tolist())


def test_prepare_limit_keeps_the_first_shuffled_examples():
    images, labels = _labelled_images(200)
    _, y_all = data.prepare(images, labels, seed=0)
    x, y = data.prepare(images, labels, seed=0, limit=30)
    assert x.shape == (30, 784)
    np.testing.assert_array_equal(y, y_all[:30])


def test_prepare_rejects_mismatched_counts():
    images, labels = _labelled_images(20)
    with pytest.raises(ValueError, match="20 images but 19 labels"):
        data.prepare(images, labels[:19])


def _dataset(n: int) -> data.Dataset:
    images = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 784), np.float32)
    return data.Dataset(images, np.arange(n, dtype=np.int32), "synthetic", "test")


def test_stacked_batches_shapes():
    x, y = data.stacked_batches(_dataset(100), n_batches=3, global_batch=16)
    assert x.shape == (3, 16, 784) and x.dtype == np.float32
    assert y.shape == (3, 16) and y.dtype == np.int32
    np.testing.assert_array_equal(y.ravel(), np.arange(48))  # consecutive batches


def test_stacked_batches_wrap_around_a_small_dataset():
    x, y = data.stacked_batches(_dataset(10), n_batches=3, global_batch=4)
    np.testing.assert_array_equal(y, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]])
    np.testing.assert_array_equal(x[2, :, 0], [8, 9, 0, 1])  # images follow labels


@pytest.mark.parametrize("n_batches, global_batch", [(0, 4), (2, 0)])
def test_stacked_batches_rejects_empty_requests(n_batches, global_batch):
    with pytest.raises(ValueError, match=">= 1"):
        data.stacked_batches(_dataset(10), n_batches, global_batch)


def test_stacked_batches_rejects_an_empty_dataset():
    with pytest.raises(ValueError, match="empty"):
        data.stacked_batches(_dataset(0), 1, 4)


def test_a_cache_folder_that_is_a_file_is_a_clear_error_and_auto_falls_back(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("")
    monkeypatch.setenv(data.DATA_DIR_ENV, str(not_a_folder))
    with pytest.raises(DataError, match="Cannot use the cache folder") as info:
        data.load_fashion_mnist("real", limit=50)
    assert data.DATA_DIR_ENV in str(info.value)
    fallback = data.load_fashion_mnist("auto", limit=50)
    assert fallback.source == "synthetic" and "Cannot use the cache folder" in fallback.note


def test_a_corrupt_cached_file_is_named_when_no_location_works(tmp_path):
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b" + b"\0" * 100)
    with pytest.raises(DataError, match="not the published file"):
        data.download("train-labels-idx1-ubyte.gz", directory=tmp_path, mirrors=("http://127.0.0.1:9/",), timeout_s=2)
    assert (tmp_path / "train-labels-idx1-ubyte.gz").stat().st_size == 102  # left as it was, still unused


def test_a_damaged_gzip_stream_is_a_data_error(tmp_path):
    good = gz(idx_bytes(np.arange(100, dtype=np.uint8)))
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # flip bits inside the deflate stream
    path = tmp_path / "x-idx1-ubyte.gz"
    path.write_bytes(bytes(bad))
    with pytest.raises(DataError):
        data.read_idx(path)


def test_the_synthetic_banner_note_keeps_the_reason(tmp_path):
    ds = data.load_fashion_mnist("auto", limit=50, directory=tmp_path, mirrors=("http://127.0.0.1:9/",))
    assert ds.source == "synthetic"
    assert "127.0.0.1:9" in ds.note and not ds.note.endswith("Tried:)")


def test_the_synthetic_set_is_kept_after_the_first_call_and_read_back_the_same(tmp_path, monkeypatch):
    fresh = data.synthetic_images(300, seed=1)
    first = data.synthetic_kept(300, seed=1, directory=tmp_path)
    kept = tmp_path / f"synthetic-v{data.SYNTHETIC_VERSION}-n300-seed1.npz"
    assert kept.is_file() and not list(tmp_path.glob("*.tmp"))
    monkeypatch.setattr(data, "synthetic_images", lambda *a, **k: pytest.fail("made again, not read"))
    again = data.synthetic_kept(300, seed=1, directory=tmp_path)
    for a, b, c in zip(fresh, first, again):
        assert np.array_equal(a, b) and np.array_equal(a, c) and a.dtype == c.dtype


def test_an_unreadable_kept_copy_is_made_again_and_an_unwritable_folder_keeps_nothing(tmp_path):
    kept = tmp_path / f"synthetic-v{data.SYNTHETIC_VERSION}-n50-seed0.npz"
    kept.write_bytes(b"half a file")
    images, labels = data.synthetic_kept(50, directory=tmp_path)
    assert np.array_equal(images, data.synthetic_images(50)[0]) and labels.shape == (50,)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    images, _ = data.synthetic_kept(50, directory=blocked / "cache")
    assert images.shape == (50, 28, 28) and not (blocked / "cache").exists()


def test_a_change_to_the_synthetic_set_comes_with_a_new_version_of_the_kept_copies():
    # Kept copies are read by version: a generator that returns other arrays under the same
    # SYNTHETIC_VERSION would keep serving the old ones. Change both together, and this digest.
    images, labels = data.synthetic_images(64, seed=0)
    digest = hashlib.md5(images.tobytes() + labels.tobytes()).hexdigest()
    assert (data.SYNTHETIC_VERSION, digest) == (1, "167ebea50c67661a16f72f5e47f8bbde")
