"""The paper's CNN written as a user would write it, in Keras: the same layers as the built-in
``mnist_cnn`` (conv 3x3x32 same + ReLU, max-pool 2, conv 3x3x64 same + ReLU, max-pool 2,
dense 128 + ReLU, dense to the classes; 421,642 parameters on MNIST).

``python -m benchmarks.boot --models builtin user`` boots Docker runs with it and with the built-in,
so the cost of a user's model (import, Keras building, tracing) is measured against the same network.
"""

import keras


def build(input_shape, classes):
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(classes),
    ])
