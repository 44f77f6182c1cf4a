"""What a run is, before anything runs: the scenario a user writes and the plan made from it.

* :mod:`.units`: sizes, rates and durations as people write them (``10mbit``, ``30ms``);
* :mod:`.scenario`: the typed scenario (pydantic) and its checks across fields;
  :mod:`.distributions`: the values a device field may take (one, a list, uniform, normal, choice);
  :mod:`.loader`: a file to a scenario, through :mod:`.safe_yaml` (bounded YAML, file and line in
  errors) and :mod:`.overrides` (``--set``);
* :mod:`.methods`: the training methods (ASGD, AdaComp, Comp-c, ...) and their parameters;
* :mod:`.problems`: what is wrong with an input, and in which field (``workers[1].cpus: must be > 0``);
* :mod:`.plan`: the seeded, frozen plan: every device, its link, CPU and shard, every timed event.

Pure: nothing here starts a process, touches the network or imports a backend.
"""
