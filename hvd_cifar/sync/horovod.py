"""Horovod: ring allreduce over MPI or Gloo, overlapped with backward by per-parameter hooks."""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from typing import Any, Mapping

import horovod.torch as hvd

from hvd_cifar import compress
from hvd_cifar.core import launcher
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.core.intervals import clip
from hvd_cifar.sync import overlap
from hvd_cifar.sync import openmpi
from hvd_cifar.sync.base import SyncMethod


def prepare_environment(elastic: bool, timeline: bool = False) -> None:
    """Horovod's settings, which it reads at hvd.init(), and the launches it cannot run under.
    ``timeline``: the run records Horovod's timeline (comm_timeline: true)."""
    # A rank that stops submitting collectives (a bug, a dead peer) would otherwise leave the
    # rest waiting forever with only a warning: after this long Horovod shuts down with an
    # error instead, which the entry point turns into an aborted job.
    os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", "30")
    os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "120")
    # A timeline can be started once a run's folder exists (comm_timeline: true) only if Horovod was
    # initialised with this set; DYNAMIC records nothing until then. Only then: with the variable
    # set, Horovod's timeline writer thread loops on yield() even while it records nothing, and
    # on 2 cores that made a one-rank step 13-51 % slower and cost 0.2-0.3 s of CPU per step (measured,
    # docs/SYNC_METHODS.md "One rank").
    if timeline:
        os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
    started_elastic = os.environ.get("HOROVOD_ELASTIC") == "1"  # set by horovodrun's elastic driver
    if elastic and not started_elastic:
        raise ConfigError("elastic: needs Horovod's elastic launcher: horovodrun -np N --min-np MIN "
                          "--max-np MAX --host-discovery-script SCRIPT python -m hvd_cifar.train ...")
    if started_elastic and not elastic:
        raise ConfigError("elastic: this job was started by horovodrun's elastic driver "
                          "(--min-np/--max-np/--host-discovery-script); set elastic: true")
    if elastic:
        # No response cache under elastic training. Horovod keeps the cache across the reset
        # that re-forms the ring (shutdown + init keep the global process set), so the
        # workers that were there before hold their entries while one that joins starts with
        # none; the ranks then mean different tensors by the same cache bit, fuse different
        # tensors into one collective, and the job dies in Gloo ("op.preamble.length <=
        # op.nbytes"). Without the cache every tensor is negotiated by name each cycle.
        os.environ["HOROVOD_CACHE_CAPACITY"] = "0"
    if os.environ.get("HOROVOD_CONTROLLER", "").lower() != "gloo":
        use_gloo_operations()


def gloo_operations() -> bool:
    """Whether Horovod's collectives on CPU tensors run on Gloo (after hvd.init())."""
    return not hvd.mpi_enabled() or os.environ.get("HOROVOD_CPU_OPERATIONS", "").lower() == "gloo"


def use_gloo_operations() -> None:
    """Under MPI's controller (mpirun, horovodrun's MPI mode, Slurm) with ranks on several hosts,
    Gloo's allreduce for CPU tensors unless the launcher chose: Open MPI waits inside a blocking
    allreduce by polling, on the core backward needs, and hides little of the ring behind
    backward; Gloo's transfers sleep in the kernel until bytes arrive, as DDP's do. On one host
    Open MPI's shared memory is faster (docs/SYNC_METHODS.md, "Overlap on a core per rank").
    Only a Horovod built by scripts/install.sh runs Gloo's there (its Fix 11); another build
    keeps MPI's."""
    import horovod

    fixed = getattr(horovod, "hvd_cifar_gloo_ops_under_mpi", False)
    if not fixed:
        if os.environ.get("HOROVOD_CPU_OPERATIONS", "").lower() == "gloo":
            # Horovod 0.28.1 as released gives the Gloo context to its global process set only
            # under its Gloo controller: every rank would die of a segmentation fault at the
            # first broadcast.
            raise ConfigError("HOROVOD_CPU_OPERATIONS=gloo: this Horovod runs Gloo's operations only under "
                              "its Gloo controller (horovodrun --gloo); bash scripts/install.sh builds one "
                              "that runs them under MPI's too, or unset it to use MPI's")
        return
    # Not under Slurm: there (srun's PMIx, and mpirun inside an allocation) every rank of this
    # project's Slurm cluster segfaulted in hvd.init() with Gloo's operations (tests/test_slurm.py),
    # for a cause not yet found, so Open MPI's are kept.
    if launcher.spans_hosts() and "SLURM_JOB_ID" not in os.environ:
        os.environ.setdefault("HOROVOD_CPU_OPERATIONS", "gloo")
    # Gloo's sockets on the interface MPI's bytes were told to use (one named interface): else
    # Gloo binds the address this host's name resolves to.
    interfaces = os.environ.get("OMPI_MCA_btl_tcp_if_include", "")
    if os.environ.get("HOROVOD_CPU_OPERATIONS", "").lower() == "gloo" and interfaces and "," not in interfaces \
            and "/" not in interfaces:
        os.environ.setdefault("HOROVOD_GLOO_IFACE", interfaces)


# Horovod's tuning, its own keys (core.methods): key -> (the variable Horovod reads at hvd.init(),
# its value from the key's).
TUNING_ENV = {
    "horovod_cycle_time_ms": ("HOROVOD_CYCLE_TIME", lambda ms: f"{ms:g}"),
    "horovod_fusion_threshold_mb": ("HOROVOD_FUSION_THRESHOLD", lambda mb: str(round(mb * 2**20))),  # bytes
    "horovod_hierarchical": ("HOROVOD_HIERARCHICAL_ALLREDUCE", lambda on: "1" if on else "0"),
    "horovod_autotune": ("HOROVOD_AUTOTUNE", lambda on: "1" if on else "0"),
}


def apply_tuning(own: Mapping[str, Any]) -> str | None:
    """Put Horovod's tuning keys (``own``: its settings of the config; docs/CONFIG.md) where
    hvd.init() reads them. Precedence: a key set in the config, then the launcher's variable
    (horovodrun --cycle-time-ms, --fusion-threshold-mb, --hierarchical-allreduce, --autotune
    export them), then hvd_cifar's default, then Horovod's own. Returns the autotune log Horovod
    will write, or None."""
    for key, (variable, spelled) in TUNING_ENV.items():
        if own.get(key) is not None:  # no config (the probes): the launcher's and the defaults
            os.environ[variable] = spelled(own[key])
    autotune = os.environ.get("HOROVOD_AUTOTUNE", "0").strip() not in ("", "0")
    if not autotune:
        # Negotiation cycle: Horovod's background thread coordinates with the other ranks once
        # per cycle; its default since 0.21 is 1 ms (5 ms before). Measured on the 4-host
        # namespace cluster (docs/SYNC_METHODS.md), 1 ms cost about a fifth of the epoch time on
        # hosts whose cores the training threads already fill, and 5 to 50 ms did equally well.
        # Not under the autotuner: a cycle time Horovod finds set is one it does not tune.
        # (Horovod as built by scripts/install.sh starts every rank's cycle together, Fix 7.)
        os.environ.setdefault("HOROVOD_CYCLE_TIME", "5")
        return None
    # The run folder does not exist yet on a fresh run: Horovod writes here, and rank 0 copies
    # the log into the run folder after each epoch (HorovodSync.run_epoch).
    return os.environ.setdefault("HOROVOD_AUTOTUNE_LOG", os.path.join(
        tempfile.gettempdir(), f"hvd_cifar-autotune-{os.getpid()}.csv"))


class HorovodSync(SyncMethod):
    name = "horovod"

    def __init__(self, cfg, autotune_log: str | None, owns_autotune_log: bool):
        """After start(cfg), which gave the autotune log and whether it is a temp file of ours."""
        self.elastic = bool(cfg and cfg.elastic)
        self.autotune_log = autotune_log
        self.owns_autotune_log = owns_autotune_log  # a temp file: removed at close()
        self.kept_autotune_log: str | None = None  # its copy in the run folder, once made
        self.optimizer = None
        self.timeline: Timeline | None = None  # comm_timeline: true
        self.waits: list[tuple[float, float]] = []  # this epoch's synchronize() calls, wall time
        self.clock_offset = 0.0  # time.time() - time.perf_counter() at the epoch's start

    # Ranks and sizes can change under elastic training (hvd.init() again after a reset).
    rank = property(lambda self: hvd.rank())
    size = property(lambda self: hvd.size())
    local_rank = property(lambda self: hvd.local_rank())
    local_size = property(lambda self: hvd.local_size())
    # Its registry entry's transports: "horovod-mpi", else "horovod-gloo" where Gloo's operations
    # run (its Gloo controller, or under MPI's with HOROVOD_CPU_OPERATIONS=gloo, use_gloo_operations'
    # choice across hosts); one negotiation cycle (HOROVOD_CYCLE_TIME, ms; apply_tuning's default)
    # before every collective.
    transport_index = property(lambda self: 1 if gloo_operations() else 0)
    collective_wait_s = property(lambda self: float(os.environ.get("HOROVOD_CYCLE_TIME", "5")) / 1000)

    def run_elastic(self, train):
        # On a worker's failure (HorovodInternalError) every survivor restores the last commit;
        # when workers are added or removed (HostsUpdatedInterrupt, raised inside commit()) they
        # keep the state just committed. Either way Horovod then re-forms the ring (shutdown +
        # init) and calls train(state) again after broadcasting rank 0's state to all.
        return hvd.elastic.run(train) if self.elastic else train

    def wrap(self, model, optimizer, named_parameters, accumulation_steps):
        # Named parameters give every allreduce a stable name across ranks. Only trainable
        # parameters are passed: Horovod hooks what it is given when the optimizer is built,
        # so a frozen parameter left in would still have zeros allreduced every step.
        if self.optimizer is not None:
            # The previous wrapper's hooks stay on the parameters' gradient accumulators (Horovod
            # keeps no handle to remove them) and would allreduce under the same names as the new
            # one's; a countdown that never reaches zero keeps them from starting any allreduce.
            for p in self.optimizer._allreduce_delay:
                self.optimizer._allreduce_delay[p] = math.inf
        distributed = self.optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=named_parameters,
            compression=hvd.Compression.fp16 if self.fp16 else hvd.Compression.none,
            # Horovod counts backward passes per parameter and allreduces on the k-th, so
            # k micro-batches cost one synchronisation.
            backward_passes_per_step=accumulation_steps,
            op=hvd.Average,
        )
        # Horovod builds a new optimizer from the param groups, with empty state: carry over the
        # momentum buffers the loop put in the one it was given (on a change of trainable set).
        distributed.state.update(optimizer.state)
        return model, distributed

    def synchronize(self, optimizer):
        # Waits for the allreduces the backward hooks started. Called explicitly (rather than
        # inside step()) so that the wait is measured as sync time and so that an update with
        # fewer than k micro-batches (an epoch's tail) still gets its gradients allreduced.
        began = time.time()  # wall time: the timeline's clock
        optimizer.synchronize()
        self.waits.append((began, time.time()))

    def configure(self, cfg):
        if cfg.own["horovod_hierarchical"] and not (hvd.nccl_built() or hvd.ddl_built()):
            # Such a build sets the hierarchical allreduce off at hvd.init() whatever it is told.
            raise ConfigError("horovod_hierarchical: this Horovod has no hierarchical allreduce (built "
                              "without NCCL or DDL, which only GPU builds have); it would change nothing")
        self.timeline = Timeline() if cfg.comm_timeline else None

    def collective(self):
        return HorovodCollective()

    def comm_spans(self):
        # Horovod's timeline is rank 0's alone (its coordinator writes it), on the wall clock.
        if self.rank != 0 or not self.timeline:
            return []
        return [(what, s - self.clock_offset, e - self.clock_offset) for what, s, e in self.timeline.operations]

    def run_epoch(self, ctx, train):
        """With ``comm_timeline: true``: record Horovod's timeline (rank 0 writes RUN/timeline.json,
        cycles marked) and split the epoch's allreduce time into what ran while synchronize()
        waited (exposed) and what ran during backward (hidden). Under the autotuner, rank 0 keeps
        its log in the run folder after each epoch."""
        if self.rank == 0 and self.timeline and self.timeline.path is None:
            self.timeline.start(ctx.run_dir)
        self.waits, began = [], time.time()
        self.clock_offset = began - time.perf_counter()  # the timeline's wall clock against the loop's
        result = train()
        if self.rank == 0 and self.timeline:
            result.extra.update(self.timeline.epoch_overlap((began, time.time()), self.waits))
        if self.rank == 0 and self.autotune_log:
            self.keep_autotune_log(ctx.run_dir)
        return result

    def keep_autotune_log(self, run_dir: str) -> None:
        """Copy Horovod's autotune log (rank 0 writes it, a line per sample) into the run folder:
        autotune.csv, or autotune-1.csv, ... when a resumed run finds one there."""
        if os.path.exists(self.autotune_log):
            self.kept_autotune_log = self.kept_autotune_log or unused_path(run_dir, "autotune", ".csv")
            shutil.copyfile(self.autotune_log, self.kept_autotune_log)

    def step(self, optimizer, scaler=None):
        with optimizer.skip_synchronize():  # synchronize() already ran
            super().step(optimizer, scaler)

    def broadcast_state(self, model):
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def allreduce_sum(self, tensor):
        # Named by what it carries, never left unnamed: Horovod names an unnamed collective
        # after a per-process counter, which a worker that joined an elastic run mid-way has at
        # another value than the others, so its collective would never match theirs.
        name = f"hvd_cifar.allreduce_sum.{str(tensor.dtype).split('.')[-1]}.{tensor.numel()}"
        return hvd.allreduce(tensor, op=hvd.Sum, name=name)

    def allreduce_sum_async(self, tensor, name):
        # Horovod's background thread runs it with the next cycle's other collectives.
        handle = hvd.allreduce_async(tensor, op=hvd.Sum, name=f"hvd_cifar.{name}")
        return lambda: hvd.synchronize(handle)

    def broadcast_object(self, obj: Any) -> Any:
        # A fixed name: Horovod's default derives it from type(obj), which differs when rank 0
        # holds a value and the others hold None, and mismatched names never complete.
        return hvd.broadcast_object(obj, root_rank=0, name="hvd_cifar.broadcast_object")

    def allgather_object(self, obj: Any) -> list:
        return hvd.allgather_object(obj, name="hvd_cifar.allgather_object")

    def close(self):
        hvd.shutdown()
        if self.owns_autotune_log and os.path.exists(self.autotune_log):
            os.remove(self.autotune_log)


class HorovodAlone(HorovodSync):
    """Horovod at size 1, outside elastic training, the timeline and fp16 compression: what
    each collective computes for one rank, without Horovod's optimizer wrapper and with nothing
    handed to its background thread (which hvd.init() started and which now idles). Bit for bit
    what the communicating path computes: an average or sum over one rank is the tensor itself
    (tests/test_horovod_alone.py)."""

    def wrap(self, model, optimizer, named_parameters, accumulation_steps):
        return model, optimizer  # gradients accumulate in .grad over the micro-batches as they are

    def synchronize(self, optimizer):
        pass

    def step(self, optimizer, scaler=None):
        SyncMethod.step(self, optimizer, scaler)

    def broadcast_state(self, model):
        pass

    def allreduce_sum(self, tensor):
        return tensor.clone()

    def allreduce_sum_async(self, tensor, name):
        return lambda: tensor.clone()

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list:
        return [obj]


class HorovodCollective(compress.Collective):
    """The schemes' collectives on Horovod (hvd.allreduce, hvd.allgather), in place of its
    DistributedOptimizer. Each name carries the size, so that a collective
    whose size changes (a new trainable set) is never matched with the old one's."""

    def __init__(self):
        super().__init__(hvd.size())

    def _allreduce_mean(self, tensor, name):
        return hvd.allreduce(tensor, op=hvd.Average, name=f"hvd_cifar.{name}.{tensor.numel()}")

    def _allgather(self, tensor, name):
        return hvd.allgather(tensor, name=f"hvd_cifar.{name}.{tensor.numel()}")


class Timeline:
    """Horovod's timeline of one run (rank 0's), read back per epoch for comm_hidden_s and
    comm_exposed_s."""

    def __init__(self):
        self.path: str | None = None  # once recording started
        self.operations: list[tuple[str, float, float]] = []  # the last epoch's (overlap.fused_operations)

    def start(self, run_dir: str) -> None:
        """Record into the run folder: timeline.json, or, when a resumed run finds one (Horovod
        would truncate it), timeline-1.json, timeline-2.json, ..."""
        path = unused_path(run_dir, "timeline", ".json")
        hvd.start_timeline(path, mark_cycles=True)
        self.path = path

    def epoch_overlap(self, window: tuple[float, float], waits: list[tuple[float, float]],
                      settle_s: float = 2.0) -> dict:
        """comm_hidden_s and comm_exposed_s of the epoch in ``window``, given the epoch's
        synchronize() waits. Horovod's writer thread lags the collectives: wait (at most
        ``settle_s``) until the file holds an event (a cycle mark) from after the epoch."""
        deadline = time.time() + settle_s
        while overlap.last_event_s(self.path) < window[1] and time.time() < deadline:
            time.sleep(0.05)
        self.operations = [op for op in overlap.fused_operations(self.path) if op[2] > window[0] and op[1] < window[1]]
        comm = clip([(s, e) for what, s, e in self.operations if what != "negotiation"], window)
        return overlap.hidden_and_exposed(comm, waits)


def unused_path(run_dir: str, stem: str, suffix: str) -> str:
    """RUN/STEM.SUFFIX, or the first of RUN/STEM-1.SUFFIX, ... not there yet (a resumed run's)."""
    path, n = os.path.join(run_dir, stem + suffix), 0
    while os.path.exists(path):
        n += 1
        path = os.path.join(run_dir, f"{stem}-{n}{suffix}")
    return path


def start(cfg) -> tuple[str | None, bool]:
    """Horovod's settings where hvd.init() reads them, then hvd.init(): the autotune log Horovod
    will write (or None) and whether it is a temp file of ours."""
    launcher_log = os.environ.get("HOROVOD_AUTOTUNE_LOG")
    autotune_log = apply_tuning(cfg.own if cfg else {})
    prepare_environment(bool(cfg and cfg.elastic), timeline=bool(cfg and cfg.comm_timeline))
    openmpi.apply_defaults()  # Horovod runs its collectives on MPI unless launched with --gloo
    hvd.init()
    return autotune_log, autotune_log not in (None, launcher_log)


def create(name: str, cfg=None) -> SyncMethod:
    """HorovodSync, or, where a world of one has nothing to average, HorovodAlone: every
    gradient, stop vote and metric sum would only pass through Horovod's wrapper and background
    thread and come back unchanged, at a cost (docs/SYNC_METHODS.md, "One rank"). Not under
    elastic training or the timeline, and not with compression: fp16 (Horovod's rounding of each
    gradient to half precision and back, redone with .half(), gave other weights after a few
    updates, cause not found; compressing for no wire is no one's fast path) or another scheme
    (which brings its own collectives)."""
    started = start(cfg)
    alone = (cfg is not None and hvd.size() == 1 and not cfg.elastic and not cfg.comm_timeline
             and cfg.compression == "none")
    return (HorovodAlone if alone else HorovodSync)(cfg, *started)
