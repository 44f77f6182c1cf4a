"""A user's Keras model as a ModelDef: layout from its trainable weights, its own initial weights under
the run's seed, gradients through its own forward pass, logits or probabilities, a saved .keras file."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # TensorFlow and Keras

NETS = """\
import keras

def logits(input_shape, classes, hidden=16):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dropout(0.2), keras.layers.Dense(classes)])

def softmax_activation(input_shape, classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(classes, activation="softmax")])

def softmax_layer(input_shape, classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(classes), keras.layers.Softmax()])

def fixed(**kwargs):
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
"""


@pytest.fixture
def nets(tmp_path):
    (tmp_path / "nets.py").write_text(NETS)
    return tmp_path / "nets.py"


def blobs(n=300, features=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n).astype(np.int32)
    centres = rng.normal(0, 3, (classes, features))
    return (centres[y] + rng.normal(0, 1, (n, features))).astype(np.float32), y


def test_layout_names_are_positional_and_the_same_however_often_keras_builds(nets):
    from emulator.runtime import models

    model = models.resolve(f"{nets}:logits", {"hidden": 8})
    layout = model.layout((6,), 3)
    assert [t.shape for t in layout.tensors] == [(6, 8), (8,), (8, 3), (3,)]
    assert [t.name.split(":")[0] for t in layout.tensors] == ["0", "1", "2", "3"]
    assert all("_1" not in t.name for t in layout.tensors)  # keras' dense_1 is not part of the name
    assert models.resolve(f"{nets}:logits", {"hidden": 8}) is model  # one per process and arguments
    again = models.KerasModel(f"{nets}:logits", {"hidden": 8})  # a second build in this process: keras numbers it anew
    assert again.layout((6,), 3) == layout


def test_initial_weights_are_the_models_own_under_the_seed(nets):
    from emulator.runtime import models

    model = models.resolve(f"{nets}:logits")
    layout = model.layout((6,), 3)
    a, b, c = model.initial_values(layout, 1), model.initial_values(layout, 1), model.initial_values(layout, 2)
    assert a.dtype == np.float32 and a.shape == (layout.total,)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    state = np.random.get_state()[1].copy()
    model.initial_values(layout, 3)
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # the controller's own draws are untouched


@pytest.mark.parametrize("function,probabilities", [("logits", False), ("softmax_activation", True), ("softmax_layer", True)])
def test_logits_and_probabilities_both_train(nets, function, probabilities):
    from emulator.runtime import models

    model = models.resolve(f"{nets}:{function}")
    layout = model.layout((6,), 3)
    assert model._probabilities(model._built[((6,), 3)]) is probabilities
    tf_model = models.TFModel(model, (6,), 3)
    x, y = blobs()
    params = model.initial_values(layout, 0)
    before, _ = tf_model.evaluate(params, x, y)
    for step in range(150):
        batch = slice((step * 20) % 300, (step * 20) % 300 + 20)
        loss, grad = tf_model.gradient(params, x[batch], y[batch])
        assert np.isfinite(loss) and grad.shape == params.shape and grad.dtype == np.float32
        params = params - 0.1 * grad
    after, loss = tf_model.evaluate(params, x, y)
    assert after > 0.9 > before or after > 0.95, (before, after)
    assert np.isfinite(loss)


def test_declared_arguments_only_and_args_may_not_shadow_the_data_sets(nets):
    from emulator.runtime import models

    assert models.resolve(f"{nets}:fixed").layout((6,), 3).total == 21  # takes neither input_shape nor classes
    with pytest.raises(models.ModelError, match="args classes are given by the data set"):
        models.resolve(f"{nets}:logits", {"classes": 4}).layout((6,), 3)


def test_a_saved_keras_model_starts_from_its_weights(tmp_path):
    import keras

    from emulator.runtime import models

    net = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)])
    net.save(tmp_path / "net.keras")
    model = models.resolve(str(tmp_path / "net.keras"))
    layout = model.layout((6,), 3)
    np.testing.assert_array_equal(model.initial_values(layout, 5), np.concatenate([w.ravel() for w in net.get_weights()]))
    with pytest.raises(models.ModelError, match="the model's output has shape"):
        models.KerasModel(str(tmp_path / "net.keras"), {}).layout((6,), 5)
    (tmp_path / "bad.keras").write_text("not a zip")
    with pytest.raises(models.ModelError, match="cannot be read as a saved Keras model"):
        models.KerasModel(str(tmp_path / "bad.keras"), {}).layout((6,), 3)
