"""A user's own data set (emulator/datasets/user.py): each form, every partition and standardisation
on it, and every bad input refused before anything runs, naming the field, the file and the array
or line. The data are small and written here."""

from __future__ import annotations

import csv
import hashlib
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from PIL import Image

from emulator import datasets
from emulator.cli import main
from emulator.datasets import prepare_shards
from emulator.planning.loader import load_scenario
from emulator.planning.plan import check_dataset
from emulator.planning.problems import ScenarioError
from emulator.planning.scenario import validate
from emulator.runtime.data import load_shard, standardize

SPECIES = ("setosa", "versicolor", "virginica")


def scenario_file(folder: Path, dataset: dict, workers: int = 3) -> Path:
    """A scenario in ``folder`` whose ``dataset`` section is ``dataset`` (paths relative to ``folder``)."""
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump({"name": "own-data", "model": "mlp", "dataset": dataset,
                                    "training": {"max_updates": 10}, "workers": [{"count": workers}]}))
    return path


def checked(folder: Path, dataset: dict, workers: int = 3, run_code: bool = True):
    return check_dataset(load_scenario(scenario_file(folder, dataset, workers))[0], run_code=run_code)


def refused(folder: Path, dataset: dict, workers: int = 3, run_code: bool = True) -> tuple[str, str]:
    """The one problem check_dataset finds: (its path, its message)."""
    with pytest.raises(ScenarioError) as caught:
        checked(folder, dataset, workers, run_code)
    assert len(caught.value.problems) == 1, caught.value.problems
    problem = caught.value.problems[0]
    return problem.path, problem.message


def spec(folder: Path, **dataset) -> dict:
    """A validated dataset section, as the plan carries it (paths made absolute against ``folder``)."""
    return load_scenario(scenario_file(folder, dataset))[0].dataset.model_dump()


def write_npz(path: Path, **arrays) -> Path:
    rng = np.random.default_rng(0)
    defaults = {"x_train": rng.normal(size=(40, 5)), "y_train": np.arange(40) % 4,
                "x_test": rng.normal(size=(12, 5)), "y_test": np.arange(12) % 4}
    np.savez(path, **{**defaults, **arrays})
    return path


def write_csv(path: Path, rows: int = 60, label: str = "species", seed: int = 0, labels=SPECIES, header=None) -> Path:
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(header or ["length", label, "width", "depth"])
        for i in range(rows):
            out.writerow([f"{rng.normal():.4f}", labels[i % len(labels)], f"{rng.normal(5, 2):.4f}", f"{rng.normal(-1):.4f}"])
    return path


def write_images(folder: Path, classes: dict[str, int], size=(6, 5), mode="L", seed=0) -> Path:
    """``count`` PNGs per class folder, each ``size`` (width, height) in Pillow ``mode``."""
    rng = np.random.default_rng(seed)
    for name, count in classes.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            shape = (size[1], size[0]) + (() if mode == "L" else (3,))
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(folder / name / f"{i:03d}.png")
    return folder


LOADER = '''
import numpy as np

def tuple_of_four(n=30, features=4):
    rng = np.random.default_rng(1)
    return rng.normal(size=(n, features)), np.arange(n) % 3, rng.normal(size=(9, features)), np.arange(9) % 3

def mapping(n=30):
    x, y, xt, yt = tuple_of_four(n)
    return {"x_train": x, "y_train": y, "x_test": xt, "y_test": yt, "class_names": ["a", "b", "c"]}

def like_keras():
    x, y, xt, yt = tuple_of_four()
    return (x, y), (xt, yt)

def wrong():
    return [1, 2]

def raises():
    return helper()

def helper():
    raise RuntimeError("the bucket is unreachable")

NOT_A_FUNCTION = 3
'''


def write_loader(folder: Path, text: str = LOADER, name: str = "load_data.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


# -- each form -------------------------------------------------------------------------------------


def test_npz_of_float_features_keeps_them_and_reports_facts(tmp_path):
    write_npz(tmp_path / "d.npz")
    found = checked(tmp_path, {"file": "d.npz"})
    assert (found.train_examples, found.test_examples, found.classes) == (40, 12, 4)
    assert found.input_shape == (5,) and found.dtype == "float32" and found.class_names is None
    assert found.name == "d.npz" and str(tmp_path / "d.npz") in found.source and len(found.sha256) == 64


def test_npz_of_uint8_images_gets_a_channel_axis_and_class_names(tmp_path):
    rng = np.random.default_rng(0)
    write_npz(tmp_path / "img.npz", x_train=rng.integers(0, 256, (8, 7, 6), dtype=np.uint8), y_train=np.arange(8) % 2,
              x_test=rng.integers(0, 256, (4, 7, 6), dtype=np.uint8), y_test=np.arange(4) % 2, class_names=np.array(["cat", "dog"]))
    data = datasets.load(spec(tmp_path, file="img.npz"))
    assert data.x_train.shape == (8, 7, 6, 1) and data.x_train.dtype == np.uint8
    assert data.class_names == ("cat", "dog") and data.classes == 2


def test_npz_string_labels_become_sorted_class_indices(tmp_path):
    write_npz(tmp_path / "s.npz", y_train=np.array(["b", "a", "c", "a"] * 10), y_test=np.array(["c", "a", "b"] * 4))
    data = datasets.load(spec(tmp_path, file="s.npz"))
    assert data.class_names == ("a", "b", "c")
    assert data.y_train[:4].tolist() == [1, 0, 2, 0] and data.y_test[:3].tolist() == [2, 0, 1]


def test_csv_with_string_labels_is_split_stratified_and_the_same_every_time(tmp_path):
    write_csv(tmp_path / "iris.csv")
    first = datasets.load(spec(tmp_path, file="iris.csv", label="species"))
    again = datasets.load(spec(tmp_path, file="iris.csv", label="species"))
    assert first.class_names == SPECIES and first.classes == 3
    assert first.x_train.dtype == np.float32 and first.input_shape == (3,)
    assert (len(first.y_train), len(first.y_test)) == (48, 12)
    assert np.bincount(first.y_test).tolist() == [4, 4, 4]  # stratified: 20% of each class
    np.testing.assert_array_equal(first.x_train, again.x_train)
    np.testing.assert_array_equal(first.y_test, again.y_test)
    other = datasets.load(spec(tmp_path, file="iris.csv", label="species", test_fraction="50%"))
    assert len(other.y_test) == 30


def test_csv_features_are_every_column_but_the_label_in_file_order(tmp_path):
    (tmp_path / "t.csv").write_text("a,label,b\n1.5,0,2\n3,1,4\n5,0,6\n7,1,8\n9,0,10\n")
    (tmp_path / "u.csv").write_text("a,label,b\n-1,1,-2\n")
    data = datasets.load(spec(tmp_path, file="t.csv", test_file="u.csv"))
    np.testing.assert_array_equal(data.x_train, np.array([[1.5, 2], [3, 4], [5, 6], [7, 8], [9, 10]], np.float32))
    np.testing.assert_array_equal(data.x_test, np.array([[-1, -2]], np.float32))
    assert data.y_train.tolist() == [0, 1, 0, 1, 0] and data.y_test.tolist() == [1] and data.class_names is None


def test_csv_integer_labels_with_gaps_keep_their_values(tmp_path):
    write_csv(tmp_path / "tr.csv", labels=("0", "2", "5"), label="label")
    write_csv(tmp_path / "te.csv", rows=9, labels=("5", "0"), label="label", seed=1)
    found = checked(tmp_path, {"file": "tr.csv", "test_file": "te.csv"})
    assert found.classes == 6 and found.class_names is None and (found.train_examples, found.test_examples) == (60, 9)


def test_image_folder_by_class_is_grayscale_uint8_and_split(tmp_path):
    write_images(tmp_path / "pics", {"zebra": 10, "ant": 10, "moth": 5})
    data = datasets.load(spec(tmp_path, file="pics"))
    assert data.class_names == ("ant", "moth", "zebra")  # sorted, as Keras numbers them
    assert data.x_train.shape[1:] == (5, 6, 1) and data.x_train.dtype == np.uint8
    assert (len(data.y_train), len(data.y_test)) == (20, 5) and np.bincount(data.y_test).tolist() == [2, 1, 2]
    pixels = np.asarray(Image.open(tmp_path / "pics" / "ant" / "000.png"))
    assert any(np.array_equal(image[..., 0], pixels) for image in np.concatenate([data.x_train, data.x_test]))


def test_image_folder_with_train_and_test_rgb_resized(tmp_path):
    write_images(tmp_path / "set" / "train", {"a": 4, "b": 4}, size=(9, 7), mode="RGB")
    write_images(tmp_path / "set" / "test", {"b": 2}, size=(4, 4), mode="RGB", seed=1)
    found = checked(tmp_path, {"file": "set", "image_size": [8, 10]}, workers=2)
    assert found.input_shape == (8, 10, 3) and found.class_names == ("a", "b") and found.classes == 2
    assert (found.train_examples, found.test_examples) == (8, 2)
    data = datasets.load(spec(tmp_path, file="set", image_size=[8, 10]))
    assert data.y_test.tolist() == [1, 1] and sorted(np.bincount(data.y_train).tolist()) == [4, 4]
    assert data.y_train.tolist() != sorted(data.y_train.tolist())  # shuffled once, so contiguous shards mix classes


def test_image_color_follows_the_files_unless_given(tmp_path):
    write_images(tmp_path / "rgb", {"a": 3, "b": 3}, mode="RGB")
    assert datasets.load(spec(tmp_path, file="rgb")).input_shape == (5, 6, 3)
    assert datasets.load(spec(tmp_path, file="rgb", color="grayscale")).input_shape == (5, 6, 1)
    write_images(tmp_path / "gray", {"a": 3, "b": 3})
    assert datasets.load(spec(tmp_path, file="gray", color="rgb")).input_shape == (5, 6, 3)


@pytest.mark.parametrize(("function", "names"), [("tuple_of_four", None), ("mapping", ("a", "b", "c")), ("like_keras", None)])
def test_a_loader_may_return_four_arrays_a_mapping_or_keras_pairs(tmp_path, function, names):
    write_loader(tmp_path)
    found = checked(tmp_path, {"loader": f"load_data.py:{function}"})
    assert (found.train_examples, found.test_examples, found.classes, found.input_shape) == (30, 9, 3, (4,))
    assert found.class_names == names and found.name == f"load_data.py:{function}"


def test_a_loader_gets_its_args(tmp_path):
    write_loader(tmp_path)
    found = checked(tmp_path, {"loader": "load_data.py:tuple_of_four", "args": {"n": 45, "features": 2}})
    assert (found.train_examples, found.input_shape) == (45, (2,))
    assert "n=45" in found.source


# -- partitions and standardisation on a user's data --------------------------------------------------


@pytest.mark.parametrize("partition", [{"partition": "shards"}, {"partition": "iid"},
                                       {"partition": "non_iid", "classes_per_worker": 1},
                                       {"partition": "non_iid", "dirichlet_alpha": 0.3}])
def test_every_partition_works_on_a_users_csv(tmp_path, partition):
    write_csv(tmp_path / "iris.csv")
    section = spec(tmp_path, file="iris.csv", label="species", **partition)
    shards = prepare_shards(section, 3, seed=0, cache_dir=tmp_path / "cache")
    assert shards.dataset == "iris.csv" and shards.class_names == SPECIES and shards.input_shape == (3,)
    seen = []
    for shard in shards.shards:
        x, y = load_shard(shard)
        assert x.dtype == np.float32 and x.shape[1:] == (3,) and len(y) > 0
        seen.append(y)
        if partition.get("classes_per_worker"):
            assert len(np.unique(y)) == 1
    assert sum(len(y) for y in seen) == 48
    assert sorted(np.concatenate(seen).tolist()) == sorted(datasets.load(section).y_train.tolist())


def test_per_feature_standardisation_uses_the_training_sets_mean_and_std(tmp_path):
    rng = np.random.default_rng(3)
    x_train = rng.normal(10, 3, size=(50, 4))
    x_train[:, 2] = 7.0  # constant: centred, not scaled
    write_npz(tmp_path / "f.npz", x_train=x_train, y_train=np.arange(50) % 2, x_test=rng.normal(10, 3, size=(6, 4)),
              y_test=np.arange(6) % 2)
    shards = prepare_shards(spec(tmp_path, file="f.npz"), 2, seed=0, cache_dir=tmp_path / "cache")
    assert shards.standardize == "per_feature" and shards.dtype == "float32"
    x32 = x_train.astype(np.float32)
    mean, std = x32.mean(axis=0, dtype=np.float64), x32.std(axis=0, dtype=np.float64)
    std[2] = 1.0
    xs = np.concatenate([load_shard(s)[0] for s in shards.shards])
    np.testing.assert_allclose(xs, (x32 - mean) / std, rtol=1e-5, atol=1e-5)  # shards: contiguous, in order
    assert np.all(xs[:, 2] == 0)
    with np.load(shards.test_set) as test:
        assert str(test["standardize"]) == "per_feature" and test["mean"].shape == (4,) and test["std"].dtype == np.float32


@pytest.mark.parametrize(("mode", "expected"), [
    ("per_example", lambda x: standardize(x)),
    ("none", lambda x: x.astype(np.float32)),
])
def test_standardize_modes_on_images(tmp_path, mode, expected):
    write_images(tmp_path / "pics", {"a": 6, "b": 6})
    shards = prepare_shards(spec(tmp_path, file="pics", standardize=mode), 2, seed=0, cache_dir=tmp_path / "cache")
    with np.load(shards.shards[0]) as raw:
        stored = raw["x"]
    assert stored.dtype == np.uint8 and shards.standardize == mode
    np.testing.assert_array_equal(load_shard(shards.shards[0])[0], expected(stored))


def test_auto_standardisation_is_per_example_for_images_and_per_feature_for_numbers(tmp_path):
    write_images(tmp_path / "pics", {"a": 6, "b": 6})
    write_npz(tmp_path / "f.npz")
    cache = tmp_path / "cache"
    assert prepare_shards(spec(tmp_path, file="pics"), 2, seed=0, cache_dir=cache).standardize == "per_example"
    assert prepare_shards(spec(tmp_path, file="f.npz"), 2, seed=0, cache_dir=cache).standardize == "per_feature"
    assert prepare_shards(spec(tmp_path, file="f.npz", standardize="per_example"), 2, seed=0, cache_dir=cache).standardize == "per_example"


# Measured with the emulator before user data existed (commit 1612840): every built-in shard loads to
# the same bytes now.
BUILT_IN_SHARDS = [
    ("digits", "iid", {}, "267fba82ee912fde7613253e78a76fcdb99b36d4c061c8de44f3994eecb50516"),
    ("mnist-5k", "shards", {}, "a4e2e83b7c42f99e321d92acf4f90d7ae550eaecba086e5f60c87c58c4fbe85b"),
    ("digits", "non_iid", {"classes_per_worker": 2}, "2e5fa51cd8ef6438a98a670d771d7c96c1633039873eab4c9ec9fdd994c269b8"),
]


@pytest.mark.parametrize(("name", "scheme", "options", "expected"), BUILT_IN_SHARDS)
def test_built_in_shards_load_bit_identical_to_before(tmp_path, name, scheme, options, expected):
    shards = prepare_shards(name, 3, partition_scheme=scheme, seed=0, cache_dir=tmp_path, **options)
    digest = hashlib.sha256()
    for file in (*shards.shards, shards.test_set):
        x, y = load_shard(file)
        digest.update(x.tobytes())
        digest.update(y.tobytes())
        digest.update(str((x.shape, x.dtype, y.dtype)).encode())
    assert shards.standardize == "per_example"
    assert digest.hexdigest() == expected


def test_a_plan_mapping_and_the_keyword_form_give_the_same_built_in_shards(tmp_path):
    section = validate({"name": "t", "training": {"max_updates": 1}, "workers": [{"count": 2}],
                        "dataset": {"name": "digits", "partition": "iid"}}).dataset.model_dump()
    assert prepare_shards(section, 2, seed=0, cache_dir=tmp_path) == \
        prepare_shards("digits", 2, partition_scheme="iid", seed=0, cache_dir=tmp_path)
    with pytest.raises(TypeError, match="partition_scheme"):
        prepare_shards(section, 2, seed=0, cache_dir=tmp_path, partition_scheme="iid")


def test_the_shard_cache_key_changes_when_the_users_file_changes(tmp_path):
    path = write_csv(tmp_path / "iris.csv")
    section = spec(tmp_path, file="iris.csv", label="species")
    first = prepare_shards(section, 2, seed=0, cache_dir=tmp_path / "cache")
    assert prepare_shards(section, 2, seed=0, cache_dir=tmp_path / "cache") == first
    write_csv(path, seed=1)
    second = prepare_shards(section, 2, seed=0, cache_dir=tmp_path / "cache")
    assert second.directory != first.directory and second.sha256 != first.sha256
    assert checked(tmp_path, {"file": "iris.csv", "label": "species"}).sha256 == second.sha256  # facts see the new file too


# -- what a section names, and what a plan runs ---------------------------------------------------------


def test_relative_paths_are_taken_against_the_scenario_folder(tmp_path):
    (tmp_path / "data").mkdir()
    section = spec(tmp_path, file="data/x.csv", test_file="data/y.csv")
    assert section["file"] == str(tmp_path / "data" / "x.csv") and section["test_file"] == str(tmp_path / "data" / "y.csv")
    assert spec(tmp_path, loader="code/l.py:load")["loader"] == f"{tmp_path / 'code' / 'l.py'}:load"


def test_user_files_and_provenance_name_every_file_with_its_hash(tmp_path):
    write_csv(tmp_path / "a.csv")
    write_csv(tmp_path / "b.csv", seed=2)
    write_loader(tmp_path)
    write_images(tmp_path / "pics", {"a": 2, "b": 2})
    assert datasets.user_files(spec(tmp_path, file="a.csv", test_file="b.csv", label="species")) == [
        ("data", str(tmp_path / "a.csv")), ("data", str(tmp_path / "b.csv"))]
    assert datasets.user_files(spec(tmp_path, loader="load_data.py:mapping")) == [("loader", str(tmp_path / "load_data.py"))]
    assert datasets.user_files(spec(tmp_path, name="digits")) == []
    recorded = datasets.provenance(spec(tmp_path, file="a.csv", label="species"))
    assert recorded == [{"role": "data", "path": str(tmp_path / "a.csv"),
                         "sha256": hashlib.sha256((tmp_path / "a.csv").read_bytes()).hexdigest(),
                         "bytes": (tmp_path / "a.csv").stat().st_size}]
    folder = datasets.provenance(spec(tmp_path, file="pics"))[0]
    assert folder["bytes"] == sum(f.stat().st_size for f in (tmp_path / "pics").rglob("*.png")) and len(folder["sha256"]) == 64


def test_planning_never_imports_a_loader(tmp_path):
    marker = tmp_path / "imported"
    write_loader(tmp_path, f"open({str(marker)!r}, 'w').write('ran')\n" + LOADER)
    assert checked(tmp_path, {"loader": "load_data.py:tuple_of_four"}, run_code=False) is None
    result = CliRunner().invoke(main, ["plan", str(tmp_path / "scenario.yaml")])
    assert result.exit_code == 0, result.output
    assert "load_data.py:tuple_of_four" in result.output and not marker.exists()
    assert checked(tmp_path, {"loader": "load_data.py:tuple_of_four"}, run_code=True).train_examples == 30
    assert marker.exists()


def test_a_built_in_scenario_names_no_user_file(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, {"name": "digits"}))[0]
    assert datasets.user_files(scenario.dataset) == [] and datasets.source_kind(scenario.dataset) == "name"
    assert load_scenario(scenario_file(tmp_path, {}))[0].dataset.name == "mnist-5k"


# -- the section's own fields ------------------------------------------------------------------------


@pytest.mark.parametrize(("dataset", "path", "words"), [
    ({"file": "d.npz", "label": "y"}, "dataset.label", "goes with a .csv file, not with a .npz file"),
    ({"file": "d.csv", "image_size": [8, 8]}, "dataset.image_size", "goes with a folder of images, not with a .csv file"),
    ({"file": "d.csv", "args": {"n": 1}}, "dataset.args", "goes with a loader"),
    ({"name": "digits", "test_file": "t.csv"}, "dataset.test_file", "not with a built-in"),
    ({"loader": "l.py:f", "path": "x"}, "dataset.path", "goes with a built-in data set (name), not with a loader"),
    ({"file": "d.csv", "test_file": "t.csv", "test_fraction": 0.3}, "dataset.test_fraction", "not both"),
    ({"name": "digits", "file": "d.csv"}, "dataset", "got name and file"),
    ({"loader": "l.py"}, "dataset.loader", "file.py:function"),
    ({"file": "d.csv", "test_fraction": 1.5}, "dataset.test_fraction", "must be < 1"),
    ({"file": "d.csv", "standardize": "zscore"}, "dataset.standardize", "per_feature"),
    ({"file": "d.csv", "delimiter": ";"}, "dataset.delimiter", ""),
])
def test_options_that_do_not_fit_the_source_are_refused_by_field(tmp_path, dataset, path, words):
    with pytest.raises(ScenarioError) as caught:
        load_scenario(scenario_file(tmp_path, dataset))
    assert [p.path for p in caught.value.problems] == [path]
    assert words in caught.value.problems[0].message


# -- bad input: each refused before anything starts, naming the field, the file and the array or line ---


def test_a_missing_file_or_folder_is_named(tmp_path):
    for name in ("gone.npz", "gone.csv", "gone_folder"):
        path, message = refused(tmp_path, {"file": name})
        assert path == "dataset.file" and message.startswith(f"{tmp_path / name}: no such")
    path, message = refused(tmp_path, {"loader": "gone.py:load"}, run_code=False)
    assert path == "dataset.loader" and message == f"{tmp_path / 'gone.py'}: no such file"


@pytest.mark.parametrize(("arrays", "words"), [
    ({"x_test": None}, "no array x_test (it has: x_train, y_train, y_test)"),
    ({"y_train": np.arange(39) % 4}, "x_train has 40 examples but y_train has 39 labels"),
    ({"y_train": np.where(np.arange(40) == 7, -1, np.arange(40) % 4)}, "y_train has label -1 at row 7"),
    ({"y_test": np.array([0, 1, 2, 3, 0, 1, 9, 3, 0, 1, 2, 3])}, "y_test has label 9 (row 6) that no example of y_train has"),
    ({"y_train": np.arange(40) % 4 + 0.5}, "y_train has label 0.5 at row 0"),
    ({"x_train": np.where(np.arange(200).reshape(40, 5) == 17, np.nan, 1.0)}, "x_train has NaN at row 3 (1 rows"),
    ({"x_test": np.full((12, 5), np.inf)}, "x_test has inf"),
    ({"x_test": np.zeros((12, 6))}, "x_train's examples have shape (5,) but x_test's (6,)"),
    ({"y_train": np.eye(4)[np.arange(40) % 4]}, "one-hot labels?"),
    ({"class_names": np.array(["a", "b"])}, "y_train has label 2 at row 2, but class_names names 2 classes"),
    ({"x_train": np.array(["a"] * 40).reshape(40, 1)}, "x_train holds <U1 values; features must be numbers"),
])
def test_bad_npz_arrays_are_named(tmp_path, arrays, words):
    file = write_npz(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if v is not None})
    if any(v is None for v in arrays.values()):
        with np.load(file) as data:
            np.savez(file, **{k: data[k] for k in data.files if arrays.get(k, 0) is not None})
    path, message = refused(tmp_path, {"file": "bad.npz"})
    assert path == "dataset.file" and message.startswith(f"{file}: ") and words in message, message


def test_a_file_that_is_no_npz_is_named(tmp_path):
    (tmp_path / "junk.npz").write_text("not a zip")
    path, message = refused(tmp_path, {"file": "junk.npz"})
    assert path == "dataset.file" and message.startswith(f"{tmp_path / 'junk.npz'}: cannot be read as a .npz")


@pytest.mark.parametrize(("text", "dataset", "field", "words"), [
    ("a,b\n1,2\n", {}, "dataset.label", "no column 'label' (its columns: a, b)"),
    ("a,label\n1,0\n2,1\nx7,0\n", {}, "dataset.file", "line 4: column 'a' is not a number: 'x7'"),
    ("a,label\n1,0\nnan,1\n", {}, "dataset.file", "line 3: column 'a' is 'nan', not a finite number"),
    ("a,label\n1,0\n2,1,3\n", {}, "dataset.file", "line 3: 3 values, but the header names 2 columns"),
    ("a,label\n1,0\n2,-1\n", {}, "dataset.file", "line 3: label '-1'"),
    ("a,label\n1,0\n2,\n", {}, "dataset.file", "line 3: no label in column 'label'"),
    ("a,label\n", {}, "dataset.file", "a header and no examples"),
    ("label\n0\n1\n", {}, "dataset.file", "no feature columns besides the label column 'label'"),
    ("a,label\n1,0\n2,1\n", {"test_fraction": 0.01}, "dataset.test_fraction", "leaves 2 to train and 0 to test"),
])
def test_bad_csv_lines_are_named(tmp_path, text, dataset, field, words):
    (tmp_path / "d.csv").write_text(text)
    path, message = refused(tmp_path, {"file": "d.csv", **dataset}, workers=1)
    assert path == field and message.startswith(f"{tmp_path / 'd.csv'}") and words in message, message


def test_a_test_file_label_unknown_to_training_is_named_with_its_line(tmp_path):
    write_csv(tmp_path / "tr.csv", labels=("cat", "dog"))
    write_csv(tmp_path / "te.csv", rows=4, labels=("dog", "cat", "dog", "emu"))
    path, message = refused(tmp_path, {"file": "tr.csv", "label": "species", "test_file": "te.csv"})
    assert path == "dataset.test_file" and message.startswith(f"{tmp_path / 'te.csv'} line 5: label 'emu'")
    write_csv(tmp_path / "te.csv", rows=4, labels=("x", "y"), header=["length", "kind", "width", "depth"])
    path, message = refused(tmp_path, {"file": "tr.csv", "label": "species", "test_file": "te.csv"})
    assert path == "dataset.test_file" and "differ from tr.csv's" in message


def test_bad_image_folders_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    path, message = refused(tmp_path, {"file": "empty"})
    assert path == "dataset.file" and message.startswith(f"{tmp_path / 'empty'}: no class folders")
    write_images(tmp_path / "loose", {"a": 2})
    for f in (tmp_path / "loose" / "a").iterdir():
        f.rename(tmp_path / "loose" / f.name)
    (tmp_path / "loose" / "a").rmdir()
    assert "its 2 images at the top level belong in one folder per class" in refused(tmp_path, {"file": "loose"})[1]
    write_images(tmp_path / "hollow", {"a": 2})
    (tmp_path / "hollow" / "b").mkdir()
    assert refused(tmp_path, {"file": "hollow"})[1].startswith(f"{tmp_path / 'hollow' / 'b'}: a class folder with no images")
    write_images(tmp_path / "sizes", {"a": 3})
    write_images(tmp_path / "sizes", {"b": 3}, size=(8, 8))
    message = refused(tmp_path, {"file": "sizes"})[1]
    assert message.startswith(f"{tmp_path / 'sizes' / 'b' / '000.png'}: 8x8 pixels") and "image_size" in message
    assert checked(tmp_path, {"file": "sizes", "image_size": [4, 4]}, workers=1).input_shape == (4, 4, 1)
    (tmp_path / "sizes" / "a" / "broken.png").write_bytes(b"not a png")
    assert refused(tmp_path, {"file": "sizes", "image_size": [4, 4]}, workers=1)[1].startswith(
        f"{tmp_path / 'sizes' / 'a' / 'broken.png'}: not an image")
    write_images(tmp_path / "tt" / "train", {"a": 2, "b": 2})
    write_images(tmp_path / "tt" / "test", {"c": 1})
    assert refused(tmp_path, {"file": "tt"}, workers=1)[1].startswith(f"{tmp_path / 'tt' / 'test' / 'c'}: a test class with no folder")


def test_a_loader_that_raises_on_import_shows_the_users_traceback(tmp_path):
    write_loader(tmp_path, "import numpy\n\nSCALE = 1 / 0\n\ndef load():\n    pass\n")
    path, message = refused(tmp_path, {"loader": "load_data.py:load"})
    assert path == "dataset.loader"
    assert f"importing {tmp_path / 'load_data.py'} raised ZeroDivisionError" in message
    assert "your code's traceback" in message and "  | " in message and "SCALE = 1 / 0" in message
    assert "emulator/" not in message  # the user's frames only


def test_a_loader_that_raises_when_called_shows_the_users_traceback(tmp_path):
    write_loader(tmp_path)
    path, message = refused(tmp_path, {"loader": "load_data.py:raises"})
    assert path == "dataset.loader" and "RuntimeError: the bucket is unreachable" in message
    assert 'raise RuntimeError("the bucket is unreachable")' in message and "in helper" in message
    assert "emulator/" not in message


@pytest.mark.parametrize(("ref", "words"), [
    ("load_data.py:wrong", "load_data.py:wrong returned a list of 2 items (int, int); expected (x_train, y_train, x_test, y_test)"),
    ("load_data.py:NOT_A_FUNCTION", "load_data.py:NOT_A_FUNCTION is a int, not a function"),
    ("load_data.py:absent", "defines no 'absent'"),
])
def test_a_loader_that_returns_the_wrong_thing_says_what_it_returned(tmp_path, ref, words):
    write_loader(tmp_path)
    path, message = refused(tmp_path, {"loader": ref})
    assert path == "dataset.loader" and words in message, message


def test_a_loaders_arrays_are_checked_like_a_files(tmp_path):
    write_loader(tmp_path, "import numpy as np\n\ndef load():\n    x = np.ones((6, 2)); x[4, 1] = np.nan\n"
                           "    return {'x_train': x, 'y_train': [0, 1] * 3, 'x_test': np.ones((2, 2)), 'y_test': [0, 1]}\n")
    path, message = refused(tmp_path, {"loader": "load_data.py:load"}, workers=1)
    assert path == "dataset.loader" and message.startswith(f"{tmp_path / 'load_data.py'}:load returned: x_train has NaN at row 4")


def test_the_cli_exits_2_naming_the_file_before_anything_starts(tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n1,2\n")
    scenario = scenario_file(tmp_path, {"file": "d.csv"})
    for command in (["plan"], ["run", "--backend", "local"]):
        result = CliRunner().invoke(main, [*command, str(scenario)])
        assert result.exit_code == 2, result.output
        assert f"dataset.label: {tmp_path / 'd.csv'}: no column 'label' (its columns: a, b)" in result.output


def test_facts_of_a_users_data_are_remembered_until_the_file_changes(tmp_path, monkeypatch):
    write_npz(tmp_path / "d.npz")
    section = spec(tmp_path, file="d.npz")
    reads = []
    real = datasets.user.READERS["npz"]
    monkeypatch.setitem(datasets.user.READERS, "npz", lambda s: reads.append(1) or real(s))
    datasets.facts(section)
    datasets.facts(section)
    assert len(reads) == 1
    write_npz(tmp_path / "d.npz", y_test=np.arange(12) % 2)
    assert datasets.facts(section).test_examples == 12 and len(reads) == 2
    assert json.dumps(section)  # the plan carries it as JSON


def test_a_run_calls_the_loader_once_for_the_check_and_the_shards(tmp_path):
    calls = tmp_path / "calls"
    write_loader(tmp_path, f"def counted():\n    open({str(calls)!r}, 'a').write('x')\n    return tuple_of_four()\n" + LOADER)
    scenario = load_scenario(scenario_file(tmp_path, {"loader": "load_data.py:counted"}))[0]
    found = check_dataset(scenario, run_code=True)
    shards = prepare_shards(scenario.dataset.model_dump(), 3, seed=0, cache_dir=tmp_path / "cache")
    assert calls.read_text() == "x"
    assert shards.sha256 == found.sha256 and sum(shards.shard_sizes) == found.train_examples == 30


def test_a_loaders_args_must_be_plain_values(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text("name: t\ntraining: {max_updates: 1}\nworkers: [{count: 1}]\n"
                    "dataset: {loader: l.py:load, args: {since: 2024-01-01}}\n")  # YAML reads a date
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.problems[0].path == "dataset.args" and "numbers, strings" in caught.value.problems[0].message


def test_a_file_that_is_neither_npz_csv_nor_folder_is_named(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros(3))
    path, message = refused(tmp_path, {"file": "x.npy"})
    assert path == "dataset.file" and message.startswith(f"{tmp_path / 'x.npy'}: expected a .npz, a .csv, or a folder")


def test_switching_a_built_in_scenario_to_a_file_on_the_command_line(tmp_path):
    write_csv(tmp_path / "iris.csv")
    scenario = scenario_file(tmp_path, {"name": "digits"})
    both = CliRunner().invoke(main, ["plan", str(scenario), "--set", "dataset.file=iris.csv"])
    assert both.exit_code == 2 and "got name and file" in both.output
    switched = CliRunner().invoke(main, ["plan", str(scenario), "--set", "dataset.name=null", "--set", "dataset.file=iris.csv",
                                         "--set", "dataset.label=species"])
    assert switched.exit_code == 0, switched.output
    assert "dataset iris.csv (shards)" in switched.output
