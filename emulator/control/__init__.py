"""Running one plan: the library's entry point and everything that watches a run.

* :mod:`.run`: ``run_scenario(...) -> Summary``, the one way in (CLI, experiments, benchmarks, tests);
* :mod:`.controller`: the emulation: configure, start, boot, probe, loop, tear down;
* :mod:`.faults`: the timed events and triggers, a table of actions;
* :mod:`.runstate`: what the traces say of the run as it goes, and the progress line;
* :mod:`.collector`: the traces from every device, over the network;
* :mod:`.rundir`: the run directory, written append-only as things happen;
* :mod:`.fidelity`: configured against measured link and CPU;
* :mod:`.summary`: ``summary.json`` from the traces, pure;
* :mod:`.cleanup`, :mod:`.doctor`: what ``emulate clean`` and ``emulate doctor`` do, over every backend.

Imports the spec, the backends, the host and the runtime's protocol; never an experiment.
"""
