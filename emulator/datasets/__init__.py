"""Datasets by name, partitions across workers, and the shard files devices read.

``sources`` finds and reads a dataset, ``partition`` splits its training set, ``shards`` writes
the files devices read.

The controller calls :func:`prepare_shards` once per run: it loads a dataset from local
files (never from the network unless ``EMULATE_DOWNLOAD=1``), splits its training set among
the workers and writes one ``.npz`` per worker plus the test set into a content-addressed cache
directory. Before anything runs, :func:`facts` tells the planner how many examples a dataset has
here, so a scenario that asks for more is refused at ``emulate plan`` time, not inside a device.

Where files are looked for: ``$EMULATE_DATA_ROOT`` (default ``/usr/share/datasets``, where
Debian's dataset packages put them) and the Keras cache (``$KERAS_HOME/datasets``, default
``~/.keras/datasets``); pointing both at an empty directory hides every system dataset (tests do).
"""

from emulator.datasets.partition import PARTITION_SCHEMES, partition
from emulator.datasets.shards import ShardSet, prepare_shards
from emulator.datasets.sources import (
    DATASETS, IDX_FILES, Dataset, DatasetFacts, DatasetUnavailable, best_available, data_root, facts, load, read_idx,
    resolve_size,
)

def user_files(spec) -> list:  # placeholder until the user data sets land: built-ins read no user file
    return []


__all__ = [
    "DATASETS", "IDX_FILES", "PARTITION_SCHEMES", "Dataset", "DatasetFacts", "DatasetUnavailable", "ShardSet",
    "best_available", "data_root", "facts", "load", "partition", "prepare_shards", "read_idx", "resolve_size",
]
