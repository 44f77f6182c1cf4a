"""The programs that run inside each emulated device: parameter server, worker, evaluator.

They depend on numpy, TensorFlow (worker, evaluator) and :mod:`compression` only, take their
whole configuration as one JSON document (``EMU_CONFIG``, read into their role's class of
:mod:`.config`), and talk to each other and to the controller over TCP with the frames of
:mod:`.protocol`.
"""
