"""Models by name: their parameter layout and initialisation (numpy), and their TensorFlow maths.

The parameter server needs only the layout and the initial values, so it never imports
TensorFlow; workers and the evaluator build a compiled gradient and evaluation function
over one flat float32 parameter vector, the same vector the server ships.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from compression.layout import Layout, TensorSpec

INIT_STD = 0.1  # the authors' truncated-normal kernels
INIT_BIAS = 0.1  # and constant biases


@dataclass(frozen=True)
class ModelDef:
    name: str
    description: str
    layout: Callable[[tuple[int, ...], int], Layout]
    forward: Callable  # forward(tensors: list[tf.Tensor], x: tf.Tensor) -> logits


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


def _cnn_layout(input_shape, classes):
    h, w, c = input_shape
    flat = (h // 4) * (w // 4) * 64
    return Layout((
        TensorSpec("conv1/kernel", (3, 3, c, 32)), TensorSpec("conv1/bias", (32,)),
        TensorSpec("conv2/kernel", (3, 3, 32, 64)), TensorSpec("conv2/bias", (64,)),
        TensorSpec("fc1/kernel", (flat, 128)), TensorSpec("fc1/bias", (128,)),
        TensorSpec("fc2/kernel", (128, classes)), TensorSpec("fc2/bias", (classes,)),
    ))


def _cnn_forward(t, x):
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


def _mlp_forward(t, x):
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

        def loss_fn(flat, x, y):
            logits = forward(tensors(flat), x)
            return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)), logits

        @tf.function(reduce_retracing=True)
        def gradient(flat, x, y):
            with tf.GradientTape() as tape:
                tape.watch(flat)
                loss, _ = loss_fn(flat, x, y)
            return loss, tape.gradient(loss, flat)

        @tf.function(reduce_retracing=True)
        def evaluate(flat, x, y):
            loss, logits = loss_fn(flat, x, y)
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
