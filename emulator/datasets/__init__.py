"""Datasets by name or from a user's files, partitions across workers, and the shard files devices read.

``sources`` finds and reads a dataset and checks every data set's arrays, ``user`` reads a
user's own (a ``.npz``, a CSV, a folder of images by class, a loader function in their file),
``partition`` splits its training set, ``shards`` writes the files devices read.

The controller calls :func:`prepare_shards` once per run: it loads a dataset from local
files (never from the network unless ``EMULATE_DOWNLOAD=1``), splits its training set among
the workers and writes one ``.npz`` per worker plus the test set into a content-addressed cache
directory. Before anything runs, :func:`facts` tells the planner how many examples a dataset has
here, so a scenario that asks for more is refused at ``emulate plan`` time, not inside a device.

Where files are looked for: ``$EMULATE_DATA_ROOT`` (default ``/usr/share/datasets``, where
Debian's dataset packages put them) and the Keras cache (``$KERAS_HOME/datasets``, default
``~/.keras/datasets``); pointing both at an empty directory hides every system dataset (tests do).
"""

from emulator.datasets.partition import PARTITION_SCHEMES, partition, stratified_split
from emulator.datasets.shards import STANDARDIZE_MODES, ShardSet, prepare_shards
from emulator.datasets.sources import (
    DATASETS, IDX_FILES, Dataset, DatasetFacts, DatasetUnavailable, best_available, data_root, facts, load, make, read_idx,
    resolve_size,
)
from emulator.datasets.user import (
    DEFAULT_DATASET, SOURCE_OPTIONS, SOURCE_WORDS, DataError, display_name, exists_without_running, provenance, source_kind, user_files,
)

__all__ = [
    "DATASETS", "DEFAULT_DATASET", "IDX_FILES", "PARTITION_SCHEMES", "SOURCE_OPTIONS", "SOURCE_WORDS", "STANDARDIZE_MODES", "DataError",
    "Dataset", "DatasetFacts", "DatasetUnavailable", "ShardSet", "best_available", "data_root", "display_name",
    "exists_without_running", "facts", "load", "make", "partition", "prepare_shards", "provenance", "read_idx",
    "resolve_size", "source_kind", "stratified_split", "user_files",
]
