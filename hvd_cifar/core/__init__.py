"""The ground floor: the typed config (config.py; its flags, flags.py; its older spellings,
aliases.py), the registries of sync methods (methods.py) and compression schemes (schemes.py)
with the keys they declare (keys.py), the names every layer chooses among (phases, metric keys),
errors, whole-file writes, the byte formulas (wire.py, cost.py), time intervals, units, stop signals and a
rank's life as a process. It imports no torch and nothing
above this folder.

May import: nothing (it is the ground floor).
"""
