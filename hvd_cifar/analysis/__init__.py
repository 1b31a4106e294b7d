"""Reading runs into numbers and pictures: summaries, tables, plots, the scaling model (fits and
predictions) and the explanation of where a multi-rank run's time went. Torch is loaded only
when the scaling model counts a model's parameters or a scheme's compute, never at import.

May import: hvd_cifar.core, hvd_cifar.runfolder, hvd_cifar.compress, hvd_cifar.workload, hvd_cifar.measure.
"""
