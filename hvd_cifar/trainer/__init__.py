"""The training loop and everything around it: one epoch of steps and the evaluation (loop.py),
the run's objects (context.py), the training state's hooks, metrics and resources per epoch,
layer freezing, preemption, elastic Horovod, resuming, recording and exit statuses. The entry
point, hvd_cifar/train.py, wires these together.

May import: hvd_cifar.core, hvd_cifar.workload, hvd_cifar.compress, hvd_cifar.sync, hvd_cifar.runfolder.
"""
