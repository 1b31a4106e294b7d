"""The ground floor: the typed config, the names every layer chooses among (sync methods,
schemes, phases, metric keys), errors, whole-file writes, the byte formulas, units, stop
signals and a rank's life as a process. It imports no torch, and nothing above this folder.

May import: nothing of hvd_cifar outside core.
"""
