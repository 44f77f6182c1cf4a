"""Host plumbing: what the emulator asks of the machine it runs on, below every backend.

* :mod:`.links`: shaping a device's link in a network namespace (qdiscs, iptables), the
  kernel's features;
* :mod:`.cgroups`: CPU quotas for plain processes;
* :mod:`.procstats`: a process's CPU time and memory from ``/proc``;
* :mod:`.images`: the runtime image, built with no network in the build;
* :mod:`.peerserver`: a listening socket with a thread per connection (the collector's and
  the Swarm agents' hub's base).

Nothing here imports the scenario, the plan (except for annotations), the controller or a
backend: the Swarm node agent imports :mod:`.links` and :mod:`.procstats` on its node.
"""
