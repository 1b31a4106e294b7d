"""The ground floor: the typed config, the names every layer chooses among (sync methods,
schemes, phases, metric keys), errors, whole-file writes, the byte formulas, units, stop
signals and a rank's life as a process. It imports no torch, and nothing above this folder but
one module of plain data: the registry of compression schemes, whose names and settings the
config's keys and the lists of names are made from.

May import: hvd_cifar.compress.registry.
"""
