"""The names hvd_cifar chooses among, each list in one place and without torch: the config
validates against them, the registries (``hvd_cifar.sync.make``, ``hvd_cifar.compress.make``)
map each name to its code, and the readers and tables use the same spellings."""
from __future__ import annotations

from hvd_cifar.compress import registry

# Gradient synchronisation methods (config key ``sync``); hvd_cifar/sync/ has one module each.
SYNC_METHODS = ("horovod", "mpi-allreduce", "mpi-gather-scatter", "ddp", "mpi-async-ps")

# Communication reduction (config key ``compression``), from hvd_cifar/compress/registry.py:
# ``none`` and ``fp16`` are the sync method's own averaging, the others (SCHEMES) a scheme that
# replaces it. ``local_sgd_steps`` > 1 selects local SGD, a scheme too.
COMPRESSIONS = registry.names()
SCHEMES = registry.replacing()
SCHEME_SYNC_METHODS = ("horovod", "ddp")  # the sync methods that run local SGD and the schemes that replace averaging

# A run's identity: the config keys that make two runs the same configuration, world size being
# what differs between them (a scaling group, a speed-up's baseline). Every table and report
# groups runs by these (hvd_cifar.analysis.summary.config_key); a run saved before a key existed
# reads as that key's default (summary.setting). ``data`` is the data set's own keys (the
# generated set's sizes and seed, the synthetic set's size), ``options`` the other keys that
# change what a step computes (summary.work_options). The precision (amp: what compute chose) is
# in it, the memory layout is not: a bf16 run is no baseline for an fp32 one, while compute: auto
# may pick another layout at another thread count for the same arithmetic (and another precision:
# summary.baselines).
RUN_IDENTITY = ("model", "dataset", "data", "batch_size", "sync", "compression", "options", "local_sgd_steps",
                "accumulation_steps", "freeze", "amp")

# The phases of a training step, in order; each epoch record has a <phase>_time_s per phase.
PHASES = ("data", "forward", "backward", "sync", "optimizer")

# The metrics line's resource figures (hvd_cifar/trainer/resources.py measures them). The
# per-rank figures, in the order of their slots; gpu_mem_peak_bytes only on CUDA.
RANK_FIELDS = ("cpu_percent", "rss_bytes", "rss_peak_bytes", "gpu_mem_peak_bytes")
HOST_FIELD = "host_cpu_percent"
# CPU seconds of a rank's process per image it trained in the epoch's pass (all its threads:
# the training threads, the communication library's, Python's), 0 on a rank that trained none.
PER_IMAGE_FIELD = "cpu_s_per_image"
RESOURCE_FIELDS = (*RANK_FIELDS, PER_IMAGE_FIELD, HOST_FIELD)


def runs_a_scheme(compression: str, local_sgd_steps: int) -> bool:
    """Whether a config hands gradient averaging to a compression scheme."""
    return local_sgd_steps > 1 or compression in SCHEMES
