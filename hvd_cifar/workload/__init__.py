"""What is trained and how an epoch of it is counted: the data sets (in memory, sharded), the
models, the optimizer and its learning-rate schedule, and an epoch's sums and result.

May import: hvd_cifar.core.
"""
