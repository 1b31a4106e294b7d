"""The names hvd_cifar chooses among, each list in one place and without torch: the config
validates against them, the registries (``hvd_cifar.sync.make``, ``hvd_cifar.compress.make``)
map each name to its code, and the readers and tables use the same spellings."""
from __future__ import annotations

from hvd_cifar.core import methods, schemes

# The values of the config keys ``sync`` and ``compression``, from their registries
# (core/methods.py, core/schemes.py); SCHEMES: the compressions that replace a sync method's
# averaging with a scheme (powersgd, topk, local-sgd), the others being its own (none, fp16).
SYNC_METHODS = methods.names()
COMPRESSIONS = schemes.names()
SCHEMES = schemes.replacing()

# A run's identity: the config keys that make two runs the same configuration, world size being
# what differs between them (a scaling group, a speed-up's baseline). Every table and report
# groups runs by these (hvd_cifar.analysis.summary.config_key); a run saved before a key existed
# reads as that key's default (summary.setting). ``data`` is the data set's own keys (the
# generated set's sizes and seed, the synthetic set's size), ``options`` the other keys that
# change what a step computes (summary.work_options). The precision (amp: what compute chose) is
# in it, the memory layout is not: a bf16 run is no baseline for an fp32 one, while compute: auto
# may pick another layout at another thread count for the same arithmetic (and another precision:
# summary.baselines).
RUN_IDENTITY = ("model", "dataset", "data", "batch_size", "sync", "compression", "options", "accumulation_steps",
                "freeze", "amp")

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

