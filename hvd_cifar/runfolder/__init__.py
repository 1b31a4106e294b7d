"""The run folder, logs/RUN_NAME/: writing it (config, metrics, events, checkpoints), reading it
back (reader.py loads no torch, so reports and sweeps read runs cheaply), the lock that keeps
one job per folder, eval.json, and TensorBoard's copy of the metrics.

May import: hvd_cifar.core.
"""
