"""A small 1-D convolutional network for accelerometer windows: the user's own Keras model.

The emulator calls ``build`` with the keyword arguments it declares among ``input_shape`` (one
example's shape, here (50, 3)) and ``classes`` (here 4), plus the scenario's ``model.args``. It
returns logits (no softmax on the last layer); a model ending in a softmax works too.
"""

import keras


def build(input_shape, classes, filters: int = 16):
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Conv1D(filters, 5, activation="relu"),
        keras.layers.MaxPooling1D(2),
        keras.layers.Conv1D(2 * filters, 5, activation="relu"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(classes),
    ])
