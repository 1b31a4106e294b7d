"""The sync methods by name: what each one is and can do, read by everything that must know one.
Plain data, no torch: the config (the key ``sync``, each method's own keys, the rules that tie
them to the others, the keys that do nothing under another method), ``--help``, the scaling
model, predict, explain, the probe, the bench's choices and the compute rules all loop over it
and ask a method's capabilities, never its name.

Adding a sync method: its module ``hvd_cifar/sync/NAME.py`` (a ``SyncMethod`` subclass and
``create(name, settings)``) and its entry in ``METHODS`` below. Its settings become config keys
and flags, validated by their rules, shown in ``--help``, saved with every run and inert (with a
warning) under another method; its capabilities decide what it may be combined with and how the
scaling model prices it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hvd_cifar.core import schemes
from hvd_cifar.core.errors import ConfigError, PredictError
from hvd_cifar.core.keys import Setting, above, at_least


@dataclass(frozen=True)
class Method:
    """One sync method: where its code is, its own keys, what it can do."""
    module: str                         # its SyncMethod's module, imported when a run uses it (it starts its library)
    title: str                          # its name in prose ("Horovod's own tuning")
    meaning: str                        # one line: how the ranks share gradients
    settings: dict[str, Setting] = field(default_factory=dict)  # config keys of its own
    # How the scaling model prices its averaging: "ring" (allreduce, 2(N-1)/N of the bytes per
    # rank), "star" (gather to one root and scatter back); the probe transports that time it
    # (the first a probe file holds is used). () : the model cannot price it (predict and
    # explain refuse the method in one line).
    collective: str = "ring"
    transports: tuple[str, ...] = ()
    # The probe's fit for the method's transport: "allreduce" (its allreduce of a buffer) or
    # "gather-scatter" (its own averaging, the root's sums timed too); None: not probed.
    probe: str | None = None
    overlaps_backward: bool = False     # its allreduce starts inside backward (hooks, buckets), so part can hide
    hierarchical_key: str | None = None  # a key of its own that asks for a hierarchical allreduce (priced as one)
    runs_schemes: bool = False          # runs the schemes that replace its averaging (powersgd, topk, local SGD)
    native: tuple[str, ...] = ("fp16",)  # the compressions its own averaging does itself
    elastic: bool = False               # elastic training (a driver that adds and removes workers)
    timeline: bool = False              # comm_timeline: true records when its communication ran
    averages_gradients: bool = True     # every rank steps on the same averaged gradients (freeze: auto needs it)
    takes_grad_scaler: bool = True      # amp: fp16's loss scaling works with it
    trains_on_every_rank: bool = True   # False: some ranks serve instead of training (the compute check runs on a trainer)
    check: Callable[[Any], None] | None = None  # rules that tie its keys to the others' (cfg)


METHODS: dict[str, Method] = {
    "horovod": Method(
        "hvd_cifar.sync.horovod", "Horovod", "Horovod's ring allreduce (MPI or Gloo), fused, started inside backward",
        settings={
            # null = the launcher's setting (horovodrun --cycle-time-ms, --fusion-threshold-mb,
            # --hierarchical-allreduce, --autotune), else hvd_cifar's or Horovod's default
            "horovod_cycle_time_ms": Setting(float, None, "negotiation cycle; unset anywhere: 5 ms (hvd_cifar's)",
                                             above(0), "must be > 0 (milliseconds)", optional=True),
            "horovod_fusion_threshold_mb": Setting(float, None, "MiB of gradients fused into one allreduce; 0 = no fusion",
                                                   at_least(0), "must be >= 0 (MiB; 0 = no fusion)", optional=True),
            "horovod_hierarchical": Setting(bool, None, "hierarchical allreduce (several ranks per host)", optional=True),
            "horovod_autotune": Setting(bool, None, "Horovod's autotuner; its log: RUN/autotune.csv", optional=True),
        },
        transports=("horovod-mpi", "horovod-gloo"), probe="allreduce", overlaps_backward=True,
        hierarchical_key="horovod_hierarchical", runs_schemes=True, elastic=True, timeline=True),
    "mpi-allreduce": Method(
        "hvd_cifar.sync.mpi", "mpi4py allreduce", "one mpi4py Allreduce of every gradient after backward",
        transports=("mpi-allreduce",), probe="allreduce"),
    "mpi-gather-scatter": Method(
        "hvd_cifar.sync.mpi", "mpi4py gather/scatter", "every gradient gathered to rank 0, averaged, scattered back",
        collective="star", transports=("mpi-p2p",), probe="gather-scatter"),
    "ddp": Method(
        "hvd_cifar.sync.ddp", "torch DDP", "torch DistributedDataParallel's bucketed Gloo allreduce inside backward",
        transports=("torch-gloo",), probe="allreduce", overlaps_backward=True, runs_schemes=True, timeline=True),
    "mpi-async-ps": Method(
        "hvd_cifar.sync.async_ps", "asynchronous parameter server",
        "workers push gradients to server ranks and pull weights, without waiting for each other",
        settings={"ps_servers": Setting(int, 1, "the first this many ranks hold the weights, the rest train",
                                        at_least(1), "must be >= 1")},
        native=(), averages_gradients=False, takes_grad_scaler=False, trains_on_every_rank=False),
}


def names() -> tuple[str, ...]:
    """Every value of the config key ``sync``."""
    return tuple(METHODS)


def settings() -> dict[str, tuple[str, Setting]]:
    """Every method's own config keys: {key: (method, setting)}, in the registry's order."""
    return {key: (name, s) for name, spec in METHODS.items() for key, s in spec.settings.items()}


def with_capability(capability: str) -> tuple[str, ...]:
    """The methods that have ``capability`` (a Method field that is true for them)."""
    return tuple(name for name, spec in METHODS.items() if getattr(spec, capability))


def runs(name: str, compression: str) -> bool:
    """Whether method ``name`` can run compression ``compression``: none always, one its own
    averaging does natively (fp16), a scheme that replaces averaging if it runs schemes."""
    spec = METHODS[name]
    return (compression == "none" or compression in spec.native
            or (schemes.replaces_averaging(compression) and spec.runs_schemes))


def priced(name: str) -> Method:
    """Method ``name``'s entry if the scaling model can price it; else one line why not."""
    spec = METHODS.get(name)
    if spec is None:
        raise PredictError(f"sync: {name!r} is not a sync method this version knows ({', '.join(METHODS)})")
    if not spec.transports:
        raise PredictError(f"sync: {name}: the scaling model cannot price it (its registry entry names no "
                          f"transport the probe times)")
    return spec
