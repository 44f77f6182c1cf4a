"""What a run is, before anything runs: the scenario a user writes and the plan made from it.

* :mod:`.units`: sizes, rates and durations as people write them (``10mbit``, ``30ms``);
* :mod:`.scenario`: the typed scenario (pydantic), its loader with file and line in errors,
  ``--set`` overrides;
* :mod:`.methods`: the training methods (ASGD, AdaComp, Comp-c, ...) and their parameters;
* :mod:`.problems`: model and data-set pairs a scenario may ask for;
* :mod:`.plan`: the seeded, frozen plan: every device, its link, CPU and shard, every timed event.

Pure: nothing here starts a process, touches the network or imports a backend.
"""
