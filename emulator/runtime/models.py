"""Models: their parameter layout and initialisation, and their TensorFlow maths.

A model is looked up by :func:`resolve`: a name of :data:`MODELS` (the paper's CNN, a small
perceptron), or a reference to a user's Keras model (``models/sensor.py:build``, a function
that returns a ``keras.Model``; or a saved ``net.keras``), which :class:`KerasModel` adapts to
the same :class:`ModelDef` shape. Either way the result gives the layout of the trainable
parameters for an input shape and a class count, a forward pass over those parameters as
tensors, and seeded initial values; workers and the evaluator build a compiled gradient and
evaluation function over one flat float32 vector, the same vector the server ships. The
parameter server needs only the layout and the initial values, which the controller writes
for it, so it never imports TensorFlow.
"""

from __future__ import annotations

import inspect
import os
import random
import re
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from compression.layout import Layout, TensorSpec

from emulator import plugins

INIT_STD = 0.1  # the authors' truncated-normal kernels
INIT_BIAS = 0.1  # and constant biases


@dataclass(frozen=True)
class ModelDef:
    """A model as the emulator uses it; the built-ins are instances, users' Keras models adapt to it."""

    name: str
    description: str
    layout: Callable[[tuple[int, ...], int], Layout]
    forward: Callable  # forward(tensors: list[tf.Tensor], x: tf.Tensor, training: bool) -> logits
    initial: Callable[[Layout, int], np.ndarray] = None  # (layout, seed) -> flat float32; None: initial_parameters

    def initial_values(self, layout: Layout, seed: int) -> np.ndarray:
        return (self.initial or initial_parameters)(layout, seed)


def _truncated_normal(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    """Normal(0, std) redrawn beyond two standard deviations, as tf.truncated_normal."""
    out = rng.normal(0.0, std, size=shape)
    bad = np.abs(out) > 2 * std
    while bad.any():
        out[bad] = rng.normal(0.0, std, size=int(bad.sum()))
        bad = np.abs(out) > 2 * std
    return out.astype(np.float32)


def initial_parameters(layout: Layout, seed: int) -> np.ndarray:
    """Flat float32 vector: kernels truncated-normal (std 0.1), biases 0.1 (the paper's code)."""
    rng = np.random.default_rng(seed)
    pieces = []
    for tensor in layout.tensors:
        if tensor.name.endswith("bias"):
            pieces.append(np.full(tensor.size, INIT_BIAS, np.float32))
        else:
            pieces.append(_truncated_normal(rng, tensor.size, INIT_STD))
    return np.concatenate(pieces)


def load_initial(path: str, layout: Layout) -> np.ndarray:
    """The initial model the controller wrote (:func:`save_initial`); ValueError if it does not fit ``layout``."""
    values = np.load(path, allow_pickle=False)
    if values.dtype != np.float32 or values.shape != (layout.total,):
        raise ValueError(f"{path}: initial model of {values.dtype} {values.shape}, expected float32 ({layout.total},)")
    return values.copy()


def save_initial(path, values: np.ndarray) -> None:
    np.save(path, np.ascontiguousarray(values, np.float32), allow_pickle=False)


def _cnn_layout(input_shape, classes):
    h, w, c = input_shape
    flat = (h // 4) * (w // 4) * 64
    return Layout((
        TensorSpec("conv1/kernel", (3, 3, c, 32)), TensorSpec("conv1/bias", (32,)),
        TensorSpec("conv2/kernel", (3, 3, 32, 64)), TensorSpec("conv2/bias", (64,)),
        TensorSpec("fc1/kernel", (flat, 128)), TensorSpec("fc1/bias", (128,)),
        TensorSpec("fc2/kernel", (128, classes)), TensorSpec("fc2/bias", (classes,)),
    ))


def _cnn_forward(t, x, training=False):
    import tensorflow as tf

    h = tf.nn.relu(tf.nn.conv2d(x, t[0], 1, "SAME") + t[1])
    h = tf.nn.max_pool2d(h, 2, 2, "VALID")
    h = tf.nn.relu(tf.nn.conv2d(h, t[2], 1, "SAME") + t[3])
    h = tf.nn.max_pool2d(h, 2, 2, "VALID")
    h = tf.reshape(h, (-1, t[4].shape[0]))
    h = tf.nn.relu(h @ t[4] + t[5])
    return h @ t[6] + t[7]


def _mlp_layout(input_shape, classes):
    inputs = int(np.prod(input_shape))
    return Layout((
        TensorSpec("fc1/kernel", (inputs, 64)), TensorSpec("fc1/bias", (64,)),
        TensorSpec("fc2/kernel", (64, classes)), TensorSpec("fc2/bias", (classes,)),
    ))


def _mlp_forward(t, x, training=False):
    import tensorflow as tf

    h = tf.reshape(x, (-1, t[0].shape[0]))
    h = tf.nn.relu(h @ t[0] + t[1])
    return h @ t[2] + t[3]


MODELS: dict[str, ModelDef] = {
    m.name: m
    for m in (
        ModelDef("mnist_cnn", "the paper's CNN: conv32-pool-conv64-pool-fc128-fc (421,642 parameters on MNIST)", _cnn_layout, _cnn_forward),
        ModelDef("mlp", "a small perceptron, one hidden layer of 64, for quick runs", _mlp_layout, _mlp_forward),
    )
}


def get(name: str) -> ModelDef:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


OUTPUTS = ("auto", "logits", "probabilities")  # what a user's model returns (auto: probabilities after a softmax)


class ModelError(plugins.PluginError):
    """A user's model that cannot train here; the message names the file and what is wrong."""


def resolve(name: str, args: dict | None = None, output: str = "auto", checked: bool = False) -> ModelDef:
    """The model called ``name`` in :data:`MODELS`, or the user's Keras model a reference names
    (``path/file.py:function`` or ``path/net.keras``), built with ``args``; one object per process
    and arguments, so every caller sees the same tensors. ``checked``: the controller has built and
    checked this model for the run already (devices): its trial forward pass is not repeated."""
    if not plugins.is_reference(name):
        if args:
            raise ModelError(f"model {name!r} is built in and takes no arguments (got {sorted(args)})")
        return get(name)
    _load_tensorflow_quietly()  # before the user's file loads it: its banner on stderr is no message for them
    key = (name, repr(sorted((args or {}).items())), output)
    if key not in _USER_MODELS:
        _USER_MODELS[key] = KerasModel(name, dict(args or {}), output, checked)
    return _USER_MODELS[key]


def _load_tensorflow_quietly() -> None:
    """Import TensorFlow with the process's stderr closed for the while: its native libraries print
    banners there whatever TF_CPP_MIN_LOG_LEVEL says. An import error still raises, with its message."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


_USER_MODELS: dict[tuple, "KerasModel"] = {}
_AUTO_NUMBER = re.compile(r"_\d+(?=/|$)")  # keras names a second dense layer dense_1: not part of the layout's names


class KerasModel(ModelDef):
    """A user's Keras model as a :class:`ModelDef`: its trainable variables are the layout, in
    order; the forward pass is the model's own ``stateless_call`` over the flat vector's tensors
    (non-trainable state such as a dropout layer's random seed is kept per process); the initial
    values are the model's own initialisers under the run's seed (a saved model: its weights).

    The function is called with the keyword arguments it declares among ``input_shape`` (a tuple,
    without the batch axis), ``classes`` (an int) and the scenario's ``args``.
    """

    def __init__(self, ref: str, args: dict, output: str = "auto", checked: bool = False):
        if output not in OUTPUTS:
            raise ModelError(f"model output {output!r}: expected one of {', '.join(OUTPUTS)}")
        path, attr = plugins.split(ref)
        object.__setattr__(self, "ref", ref)
        object.__setattr__(self, "file", path)
        object.__setattr__(self, "attr", attr)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "checked", checked)
        object.__setattr__(self, "_built", {})  # (input shape, classes) -> the keras.Model built for them
        object.__setattr__(self, "_states", {})  # ... -> its non-trainable state as this process's tf.Variables
        super().__init__(ref, f"the user's Keras model {ref}", self._layout, self._forward, self._initial)

    # -- building ------------------------------------------------------------------------

    def build(self, input_shape: tuple[int, ...], classes: int):
        """A fresh ``keras.Model`` from the user's function or file, built and checked."""
        import keras

        shape = tuple(int(d) for d in input_shape)
        if self.attr is None:
            if not self.file.endswith(".keras"):
                raise ModelError(f"{self.file}: a model is a Python file and its function (file.py:build) or a saved .keras file")
            if self.args:
                raise ModelError(f"{self.file}: a saved model takes no args (got {sorted(self.args)})")
            try:
                model = keras.saving.load_model(self.file, compile=False)
            except (OSError, ValueError) as error:
                raise ModelError(f"{self.file}: cannot be read as a saved Keras model: {error}") from None
        else:
            function = plugins.load(self.ref)
            if not callable(function):
                raise ModelError(f"{self.ref}: is a {type(function).__name__}, not a function that returns a Keras model")
            model = plugins.call(function, **self._arguments(function, shape, classes), what=f"{self.ref}")
        if not isinstance(model, keras.Model):
            raise ModelError(f"{self.ref}: returned {type(model).__name__}, not a keras.Model")
        if self.checked and model.built:
            return model  # a device: the controller ran the checks below on this model for this run
        try:
            out = plugins.call(model, np.zeros((2, *shape), np.float32), what=f"the model of {self.ref} on inputs of shape {shape}")
        except plugins.UserCodeError as error:
            raise ModelError(f"{self.ref}: the model does not take inputs of shape {shape} (the data set's), "
                             f"batch axis first: {error.error}") from None
        width = tuple(out.shape)[1:]
        if width != (classes,):
            raise ModelError(f"{self.ref}: the model's output has shape {width} per example; the data set has {classes} "
                             f"classes, so it must be ({classes},): one score per class")
        if not model.trainable_variables:
            raise ModelError(f"{self.ref}: the model has no trainable weights")
        stateful = [v.path for v in model.non_trainable_variables if "seed_generator" not in v.path]
        if stateful:
            raise ModelError(f"{self.ref}: the model has non-trainable weights ({', '.join(stateful[:4])}): the parameter "
                             "server holds trainable weights only, so these would never be shared or trained (batch "
                             "normalisation's moving statistics are such weights: use LayerNormalization or GroupNormalization)")
        return model

    def _arguments(self, function, shape, classes) -> dict:
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):
            parameters = {}
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        offered = {"input_shape": shape, "classes": classes}
        kwargs = {k: v for k, v in offered.items() if takes_any or k in parameters}
        clash = sorted(set(self.args) & set(kwargs))
        if clash:
            raise ModelError(f"{self.ref}: args {', '.join(clash)} are given by the data set; leave them out of model.args")
        return {**kwargs, **self.args}

    def _model(self, input_shape, classes):
        key = (tuple(int(d) for d in input_shape), int(classes))
        if key not in self._built:
            self._built[key] = self.build(*key)
        return self._built[key]

    def _layout(self, input_shape, classes) -> Layout:
        model = self._model(input_shape, classes)
        return Layout(tuple(TensorSpec(f"{i}:{_AUTO_NUMBER.sub('', v.path)}", tuple(int(d) for d in v.shape))
                            for i, v in enumerate(model.trainable_variables)))

    def _initial(self, layout: Layout, seed: int) -> np.ndarray:
        """The model's own initial weights under ``seed`` (a saved model: its weights), flat float32.

        Python's and numpy's global random states are put back after: the controller's own draws stay its own."""
        import keras

        if self.attr is None:
            model = self._model(*self._key_of(layout))
        else:
            states = random.getstate(), np.random.get_state()
            try:
                keras.utils.set_random_seed(int(seed))
                model = self.build(*self._key_of(layout))
            finally:
                random.setstate(states[0])
                np.random.set_state(states[1])
        values = [np.asarray(v.numpy(), np.float32).ravel() for v in model.trainable_variables]
        if tuple(v.size for v in values) != layout.sizes:
            raise ModelError(f"{self.ref}: built twice, the model's weights differ in shape: is it built the same way each time?")
        return np.concatenate(values)

    def _key_of(self, layout: Layout):
        for key in self._built:
            if self._layout(*key) == layout:
                return key
        raise ModelError(f"{self.ref}: no built model has this layout")

    # -- the maths -----------------------------------------------------------------------

    def _forward(self, tensors, x, training=False):
        import tensorflow as tf

        shape = tuple(int(d) for d in x.shape[1:])
        key = next((k for k in self._built if k[0] == shape), None)
        if key is None:
            raise ModelError(f"{self.ref}: no model was built for inputs of shape {shape}")
        model = self._built[key]
        if key not in self._states:
            self._states[key] = [tf.Variable(v.value, trainable=False) for v in model.non_trainable_variables]
        state = self._states[key]
        out, new_state = model.stateless_call(list(tensors), [v.value() for v in state], x, training=training)
        if training:
            for variable, value in zip(state, new_state):
                variable.assign(value)
        if self._probabilities(model):
            return tf.math.log(tf.clip_by_value(out, 1e-7, 1.0))  # log-probabilities: their softmax is the probabilities
        return out

    def _probabilities(self, model) -> bool:
        """Whether the model's outputs are probabilities: said by ``output``, else (auto) a last layer
        that is a softmax (its activation, an Activation("softmax") or a Softmax layer)."""
        if self.output != "auto":
            return self.output == "probabilities"
        last = model.layers[-1] if model.layers else None
        activation = getattr(last, "activation", None)
        return getattr(activation, "__name__", "") == "softmax" or type(last).__name__ == "Softmax"


class TFModel:
    """Compiled gradient and evaluation of a model over one flat parameter vector."""

    def __init__(self, model: ModelDef, input_shape: tuple[int, ...], classes: int, threads: int = 1):
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(max(1, threads))
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:
            pass  # already initialised in this process (tests): keep what is set
        self.layout = model.layout(tuple(input_shape), classes)
        sizes = list(self.layout.sizes)
        shapes = [t.shape for t in self.layout.tensors]
        forward = model.forward

        def tensors(flat):
            return [tf.reshape(p, s) for p, s in zip(tf.split(flat, sizes), shapes)]

        def loss_fn(flat, x, y, training):
            logits = forward(tensors(flat), x, training=training)
            return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)), logits

        @tf.function(reduce_retracing=True)
        def gradient(flat, x, y):
            with tf.GradientTape() as tape:
                tape.watch(flat)
                loss, _ = loss_fn(flat, x, y, True)
            return loss, tape.gradient(loss, flat)

        @tf.function(reduce_retracing=True)
        def evaluate(flat, x, y):
            loss, logits = loss_fn(flat, x, y, False)
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y), tf.int32))
            return loss, correct

        self._gradient = gradient
        self._evaluate = evaluate
        self._tf = tf

    def warm_up(self, params: np.ndarray, x: np.ndarray, y: np.ndarray, evaluate_batch: int | None = None) -> None:
        """Trace the compiled functions once, so graph building is not counted as device work."""
        if evaluate_batch:
            self._evaluate(params, x[:evaluate_batch], y[:evaluate_batch])
        else:
            self._gradient(params, x, y)

    def gradient(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean cross-entropy on the batch and its gradient as one flat float32 vector."""
        loss, grad = self._gradient(params, x, y)
        return float(loss), grad.numpy()

    def evaluate(self, params: np.ndarray, x: np.ndarray, y: np.ndarray, batch: int = 1000) -> tuple[float, float]:
        """(accuracy, mean loss) over the whole set, in fixed batches."""
        total_loss, correct = 0.0, 0
        for start in range(0, len(x), batch):
            xb, yb = x[start : start + batch], y[start : start + batch]
            loss, ok = self._evaluate(params, xb, yb)
            total_loss += float(loss) * len(xb)
            correct += int(ok)
        return correct / len(x), total_loss / len(x)
