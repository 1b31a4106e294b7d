"""The scaling model (docs/SCALING.md): what one training step costs at a worker count, from one
run's measured phases, the model's parameters and a network's links.

* the equations: seconds per synchronisation (ring, gather/scatter, hierarchical allreduce), the
  bytes each rank sends, what of it backward hides; which prices a method, and whether part hides,
  its registry entry says (core.methods: collective, overlaps_backward, hierarchical_key);
* the fits, in ``fits``: latency α and bandwidth β of a link from timed messages (the probe's);
* the prediction: a run's step (``measure``) at other worker counts, sync methods and options
  (a compression of core/schemes.py with its own compute, ``time_schemes``; accumulation,
  freezing), and the model's answers: the bandwidth below which an option pays
  (``break_even_bandwidth``), the worker count at which gather/scatter falls behind.

Imported by the probe (an MPI program), ``hvd_cifar.predict`` and ``hvd_cifar.analysis.explain``; no
plotting and no command line here. The byte counts are the sync methods' own, ``profile`` counts
on the real model and ``time_schemes`` times the schemes: they load torch when first called, and
nothing else here needs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hvd_cifar.analysis.summary import setting, steady_epochs, value
from hvd_cifar.core import cost, methods, schemes, wire
from hvd_cifar.core.errors import PredictError
from hvd_cifar.core.names import PHASES
from hvd_cifar.runfolder.reader import Run


# ----------------------------------------------------------------------------- the equations
@dataclass(frozen=True)
class Link:
    """One transport between two ranks: latency ``alpha_s`` per message, bandwidth
    ``beta_bytes_per_s``, ``reduce_s_per_byte``, one rank's cost of summing a buffer in memory
    (the root of gather/scatter sums N-1 of them), and ``per_op_s``, a wait once per collective
    whatever N (Horovod's: one negotiation cycle, HOROVOD_CYCLE_TIME)."""
    alpha_s: float
    beta_bytes_per_s: float
    reduce_s_per_byte: float = 0.0
    source: str = ""
    per_op_s: float = 0.0


def ring_wire_bytes(n: int, payload: int) -> float:
    """Bytes one rank sends per ring allreduce: the sync methods' own count (core.wire)."""
    return wire.ring_allreduce_bytes(n, payload)


def star_wire_bytes(n: int, payload: int) -> float:
    """Bytes the root of gather/scatter sends per synchronisation (it receives as many): the
    gather/scatter method's own count."""
    return wire.gather_scatter_root_bytes(n, payload)


def wire_bytes(collective: str, n: int, payload: int, ranks_per_host: int = 1) -> float:
    """Bytes one rank sends per synchronisation by ``collective`` (ring, star, hierarchical;
    Scenario.collective): the root's, for a star. Hierarchical: what each of a host's L ranks
    sends across hosts, its S/L slice of the host's ring."""
    if collective == "star":
        return star_wire_bytes(n, payload)
    if collective == "hierarchical":
        per_host = max(1, min(ranks_per_host, n))
        return ring_wire_bytes(math.ceil(n / per_host), payload) / per_host
    return ring_wire_bytes(n, payload)


def ring_s(n: int, payload: int, link: Link) -> float:
    """Ring allreduce (reduce-scatter, then allgather): 2(N-1) steps, each one message of S/N
    on every link at once: τ + 2(N-1)·α + 2(N-1)/N·S/β (τ: the link's per-collective wait)."""
    if n <= 1:
        return 0.0
    return link.per_op_s + 2 * (n - 1) * link.alpha_s + ring_wire_bytes(n, payload) / link.beta_bytes_per_s


def gather_scatter_s(n: int, payload: int, link: Link) -> float:
    """Gather to one root, sum there, send the mean to each: the root's link carries N-1
    buffers in, then N-1 out, one message each: 2(N-1)·α + 2(N-1)·S/β + (N-1)·S·γ."""
    if n <= 1:
        return 0.0
    wire = star_wire_bytes(n, payload)
    return 2 * (n - 1) * link.alpha_s + 2 * wire / link.beta_bytes_per_s + wire * link.reduce_s_per_byte


def hierarchical_s(n: int, ranks_per_host: int, payload: int, link: Link, local: Link) -> float:
    """Horovod's hierarchical allreduce, L ranks on each of H = ceil(N/L) hosts: reduce-scatter
    inside each host, an allreduce across hosts of each local rank's S/L slice (the L slices
    share the host's link, S in all), allgather inside the host:
    ring_local(L, S) + 2(H-1)·α + 2(H-1)/H·S/β."""
    per_host = max(1, min(ranks_per_host, n))
    hosts = math.ceil(n / per_host)
    return ring_s(per_host, payload, local) + ring_s(hosts, payload, link)


def comm_s(collective: str, n: int, payload: int, link: Link, local: Link, ranks_per_host: int) -> float:
    """Seconds one synchronisation of ``payload`` bytes by ``collective`` takes over ``n`` ranks."""
    if collective == "star":
        return gather_scatter_s(n, payload, link)
    if collective == "hierarchical":
        return hierarchical_s(n, ranks_per_host, payload, link, local)
    return ring_s(n, payload, link)


def exposed_s(comm: float, hidden_fraction: float, backward_s: float) -> float:
    """What the step waits for: the communication not hidden behind backward. At most the
    measured fraction of it hides, and never more than the backward it hides behind."""
    return comm - min(hidden_fraction * comm, backward_s)


def overlap_exposed_s(pieces: list[tuple[float, float]], comm: float, backward_s: float) -> float:
    """The wait when no hidden fraction was measured: ``pieces`` (share of backward, share of the
    bytes) in the order backward makes them ready; each one's allreduce starts once it is ready
    and the link is free, and takes its share of ``comm``; what is left after backward is exposed."""
    ready = link_free = 0.0
    for backward_share, byte_share in pieces:
        ready += backward_s * backward_share
        link_free = max(ready, link_free) + comm * byte_share
    return max(link_free - backward_s, 0.0)


# ----------------------------------------------------------------------------- what the run measured
@dataclass(frozen=True)
class Compute:
    """One rank's step as a run measured it (steady-state epochs), and the settings it ran with."""
    model: str
    num_classes: int
    sync: str
    world_size: int
    compression: str            # core/schemes.py's name (fp16 among them)
    accumulation_steps: int
    frozen_blocks: int
    images_per_step: float      # per rank (a micro-batch)
    data_s: float               # per micro-batch step
    forward_s: float
    backward_s: float
    other_s: float              # step time the phases do not cover (bookkeeping between steps)
    optimizer_s: float          # per update
    sync_s: float               # per update: the wait in synchronize()
    hidden_fraction: float | None  # measured comm_hidden / (hidden + exposed), None if not recorded
    step_s: float               # measured wall time per micro-batch step
    comm_s: float | None = None     # per update: comm_hidden_s + comm_exposed_s, if recorded
    exposed_s: float | None = None  # per micro-batch step: comm_exposed_s, if recorded
    threads_per_rank: int = 0       # the run's setting (0: chosen from the cores on its host)
    contention: float = 0.0         # backward seconds added per second of allreduce hidden behind it


def _total(records: list[dict], key: str) -> float:
    return sum(value(r, key) for r in records)


def measure(run: Run) -> Compute:
    """The run's phases over its steady-state epochs (hvd_cifar.analysis.summary's rule)."""
    steady = steady_epochs(run.metrics)
    steps, syncs = _total(steady, "steps"), _total(steady, "syncs")
    if not steps > 0 or not syncs > 0 or any(math.isnan(_total(steady, f"{p}_time_s")) for p in PHASES):
        raise PredictError(f"{run.path}: metrics.jsonl lacks steps, syncs or phase times")
    per_step = {p: _total(steady, f"{p}_time_s") / steps for p in ("data", "forward", "backward")}
    step_s = _total(steady, "epoch_time_s") / steps
    images = sum(value(r, "images_per_s") * value(r, "epoch_time_s") for r in steady)
    hidden, exposed = _total(steady, "comm_hidden_s"), _total(steady, "comm_exposed_s")
    last = run.metrics[-1]
    world = int(setting(run, "world_size") or 1)
    optimizer_s, sync_s = _total(steady, "optimizer_time_s") / syncs, _total(steady, "sync_time_s") / syncs
    covered = sum(per_step.values()) + (optimizer_s + sync_s) * syncs / steps
    return Compute(
        model=str(setting(run, "model")), num_classes=100 if setting(run, "dataset") == "cifar100" else 10,
        sync=str(setting(run, "sync")), world_size=world, compression=str(setting(run, "compression") or "none"),
        accumulation_steps=int(setting(run, "accumulation_steps") or 1),
        frozen_blocks=int(last.get("frozen_blocks", 0)), images_per_step=images / steps / world,
        **{f"{p}_s": v for p, v in per_step.items()}, other_s=max(step_s - covered, 0.0),
        optimizer_s=optimizer_s, sync_s=sync_s,
        hidden_fraction=hidden / (hidden + exposed) if hidden + exposed > 0 else None, step_s=step_s,
        comm_s=(hidden + exposed) / syncs if hidden + exposed > 0 else None,
        exposed_s=exposed / steps if hidden + exposed > 0 else None,
        threads_per_rank=int(setting(run, "threads_per_rank") or 0))


def with_overlap(c: Compute, traced: Compute, shared_cores: int | None = None) -> Compute:
    """``c`` with the overlap ``traced`` (a run at N ranks with its allreduce timed) measured:
    the fraction of the allreduce hidden behind backward, and what hiding it cost backward. The
    cores that compute also carry the transfer (the kernel's networking, the reduction), so
    backward at N is slower than ``c``'s by more than the cores shared: that excess per second
    hidden is ``contention``, and a step that hides more pays more (predict_step)."""
    if traced.hidden_fraction is None or not traced.comm_s:
        return replace(c, hidden_fraction=traced.hidden_fraction)
    slower = (cpu_share(traced.world_size, c.threads_per_rank, shared_cores)
              / cpu_share(c.world_size, c.threads_per_rank, shared_cores)) if shared_cores else 1.0
    hidden = traced.hidden_fraction * traced.comm_s  # per update
    excess = (traced.backward_s - slower * c.backward_s) * traced.accumulation_steps  # per update
    return replace(c, hidden_fraction=traced.hidden_fraction, contention=max(excess, 0.0) / hidden if hidden else 0.0)


@dataclass(frozen=True)
class Profile:
    """A model's feature blocks: parameters and forward multiply-adds of each, and of the rest."""
    block_params: tuple[int, ...]
    block_macs: tuple[int, ...]
    head_params: int
    head_macs: int
    param_shapes: tuple = ()  # (block index, shape) of each parameter; the head's: len(block_params)

    def backward_share(self, frozen: int) -> float:
        """Share of backward a run with ``frozen`` blocks still does: a frozen block needs no
        gradient for its weights nor (being first) for its input, so its backward goes; a layer's
        backward costs about twice its forward, so the share follows forward multiply-adds."""
        total = sum(self.block_macs) + self.head_macs
        return 1 - sum(self.block_macs[:frozen]) / total

    def ready_order(self, frozen: int) -> list[tuple[float, float]]:
        """The trainable parts in the order backward finishes their gradients (the head, then the
        blocks from the last to the first trainable one), each as (share of the remaining
        backward, by forward multiply-adds; share of the gradient bytes)."""
        parts = [(self.head_macs, self.head_params),
                 *zip(self.block_macs[frozen:][::-1], self.block_params[frozen:][::-1])]
        macs, params = sum(m for m, _ in parts) or 1, sum(p for _, p in parts) or 1
        return [(m / macs, p / params) for m, p in parts]

    def trainable_shapes(self, frozen: int) -> list[tuple[int, ...]]:
        """The shapes of the parameters that still train with ``frozen`` blocks frozen."""
        return [shape for block, shape in self.param_shapes if block >= frozen]

    def payload_bytes(self, frozen: int, compression: str = "none") -> int:
        """Gradient bytes per synchronisation of the sync method's own averaging: the trainable
        parameters, each element as ``compression`` sends it (fp16's entry: 2 bytes)."""
        numel = sum(self.block_params[frozen:]) + self.head_params
        return numel * (schemes.SCHEMES[compression].element_bytes or wire.FP32_BYTES)


def profile(model_name: str, num_classes: int) -> Profile:
    """Counts parameters and multiply-adds (convolutions, linear layers) per feature block on one
    32x32 image, with forward hooks on the real model."""
    import torch
    from hvd_cifar.workload.models import build_model
    model = build_model(model_name, num_classes)
    macs: dict[int, int] = {}

    def count(module, inputs, output):
        per_out = (module.in_channels // module.groups * math.prod(module.kernel_size)
                   if isinstance(module, torch.nn.Conv2d) else module.in_features)
        macs[id(module)] = output.numel() * per_out
    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, 32, 32))
    for h in hooks:
        h.remove()
    blocks = model.feature_blocks
    block_macs = tuple(sum(macs.get(id(m), 0) for m in b.modules()) for b in blocks)
    block_params = tuple(sum(p.numel() for p in b.parameters()) for b in blocks)
    all_params = sum(p.numel() for p in model.parameters())
    in_block = {id(p): i for i, b in enumerate(blocks) for p in b.parameters()}
    shapes = tuple((in_block.get(id(p), len(blocks)), tuple(p.shape)) for p in model.parameters())
    return Profile(block_params, block_macs, all_params - sum(block_params), sum(macs.values()) - sum(block_macs), shapes)


# ----------------------------------------------------------------------------- one prediction
# The keys of a prediction's row that name its scenario (predict_step's row; a measured run's).
SCENARIO_KEYS = ("method", "hierarchical", "np", "compression", "accumulation_steps", "freeze")


@dataclass(frozen=True)
class Scenario:
    """What to predict: a sync method, a compression of core/schemes.py with its settings, and
    the options of docs/COMM_OPTIONS.md."""
    method: str
    compression: str            # none, fp16, or a scheme that replaces averaging
    accumulation_steps: int
    freeze: int
    settings: tuple = ()        # the compression's settings, as (key, value) pairs (schemes.of); unnamed: defaults
    hierarchical: bool = False  # the method's hierarchical allreduce (its entry's hierarchical_key)
    scheme_s: float = 0.0       # the compression's own compute per update (fp16: the casts), timed on a rank with cores of its own (time_schemes)

    @property
    def label(self) -> str:
        """The compression and its byte-shaping settings as a table's cell."""
        return schemes.label(self.compression, dict(self.settings))

    @property
    def collective(self) -> str:
        """The method's own averaging: its entry's collective (ring, star), or hierarchical."""
        spec = methods.METHODS[self.method]
        return "hierarchical" if self.hierarchical and spec.hierarchical_key else spec.collective


def compression_of(config: dict) -> tuple[str, tuple]:
    """A run's compression and that scheme's settings (its saved config), as Scenario holds them."""
    name = config.get("compression") or "none"
    return name, tuple(schemes.of(name, config).items())


def hierarchical_of(method: str, config: dict) -> bool:
    """Whether a run's config asked ``method`` for its hierarchical allreduce (its entry's key)."""
    key = methods.METHODS[method].hierarchical_key
    return bool(key and config.get(key))


def as_run(c: Compute, config: dict) -> Scenario:
    """The scenario a measured run ran (``config``: its saved config)."""
    compression, settings = compression_of(config)
    return Scenario(c.sync, compression, c.accumulation_steps, c.frozen_blocks, settings, hierarchical_of(c.sync, config))


def time_schemes(prof: Profile, scenarios: list[Scenario], threads: int) -> list[Scenario]:
    """Each scenario with its compression's compute per update (``scheme_s``: a scheme's arithmetic,
    fp16's casts; 0 for none) timed here on the shapes it trains, with ``threads`` torch threads (the
    run's threads_per_rank; 0: this process's), once per compression, settings and frozen set."""
    from hvd_cifar.compress.compute import seconds_per_update  # loads torch: only when asked
    timed: dict = {}

    def with_compute(s: Scenario) -> Scenario:
        key = (s.compression, s.settings, s.freeze)
        if key not in timed:
            timed[key] = seconds_per_update(prof.trainable_shapes(s.freeze), s.compression,
                                            values=dict(s.settings), threads=threads)
        return replace(s, scheme_s=timed[key])
    return [with_compute(s) if s.compression != "none" else s for s in scenarios]


@dataclass(frozen=True)
class Network:
    """The links the prediction runs over, per method (from a probe or from --bandwidth)."""
    links: dict          # method -> Link across hosts
    local: Link | None   # inside a host (hierarchical allreduce); None: the cross-host link
    ranks_per_host: int = 1
    shared_cores: int = 0         # every rank on one machine with this many cores; 0: each rank its own


def cpu_share(n: int, threads_per_rank: int, shared_cores: int) -> float:
    """How many times slower a rank computes at ``n`` ranks than with cores to itself: 1 when each
    rank has its own cores (``shared_cores`` 0), else n·t/C when the n ranks' t threads each
    oversubscribe the C cores of the one machine they all run on (the namespace cluster)."""
    return max(1.0, n * threads_per_rank / shared_cores) if shared_cores else 1.0


def predict_step(c: Compute, prof: Profile, net: Network, s: Scenario, n: int) -> dict:
    """Seconds per micro-batch step on one rank at ``n`` ranks, and what makes them up."""
    link = net.links[s.method]
    slower = (cpu_share(n, c.threads_per_rank, net.shared_cores)
              / cpu_share(c.world_size, c.threads_per_rank, net.shared_cores))
    backward = slower * c.backward_s * prof.backward_share(s.freeze) / prof.backward_share(c.frozen_blocks)
    plan = schemes.plan(s.compression, prof.trainable_shapes(s.freeze), dict(s.settings))
    if plan is None:  # the method's own averaging of every gradient
        payload = prof.payload_bytes(s.freeze, s.compression)
        comm = comm_s(s.collective, n, payload, link, net.local or link, net.ranks_per_host)
        sent = wire_bytes(s.collective, n, payload, net.ranks_per_host)
    else:  # a scheme's collectives, rings and allgathers, each in its share of the updates
        payload = sum(share * size for _, size, share in plan)
        comm = sum(share * (ring_s(n, size, link) if kind == "allreduce" else cost.allgather_s(n, size, link))
                   for kind, size, share in plan)
        sent = sum(share * (ring_wire_bytes(n, size) if kind == "allreduce" else wire.allgather_bytes(n, size))
                   for kind, size, share in plan)
    # A scheme communicates after backward: nothing of it hides. Unmeasured, what hides follows
    # from the order backward makes the gradients ready.
    if not methods.METHODS[s.method].overlaps_backward or plan is not None:
        exposed = comm
    else:
        exposed = (overlap_exposed_s(prof.ready_order(s.freeze), comm, backward) if c.hidden_fraction is None
                   else exposed_s(comm, c.hidden_fraction, backward))
    compute = slower * (c.data_s + c.forward_s + c.other_s) + backward
    contended = c.contention * (comm - exposed)  # backward slowed by the transfer it hides (with_overlap)
    # Its own arithmetic once per update (a scheme's; fp16's casts, which one rank alone does not
    # do): timed with cores to itself, so shared as at n.
    own_s = s.scheme_s if plan is not None or n > 1 else 0.0
    scheme = cpu_share(n, c.threads_per_rank, net.shared_cores) * own_s
    step = compute + (slower * c.optimizer_s + scheme + exposed + contended) / s.accumulation_steps
    return {"method": s.method, "hierarchical": s.hierarchical, "np": n, "accumulation_steps": s.accumulation_steps,
            "freeze": s.freeze, "compression": s.label, "payload_bytes": payload, "comm_s_per_sync": comm,
            "exposed_s_per_sync": exposed, "contended_s_per_sync": contended, "scheme_s_per_sync": scheme, "compute_s": compute, "step_s": step,
            "images_per_s": n * c.images_per_step / step, "bytes_per_rank_per_step": sent / s.accumulation_steps}


def predict(c: Compute, prof: Profile, net: Network, scenarios: list[Scenario], nps: list[int]) -> list[dict]:
    """One row per scenario and world size; efficiency against the same scenario at one rank."""
    rows = []
    for s in scenarios:
        one = predict_step(c, prof, net, s, 1)["step_s"]
        for n in nps:
            row = predict_step(c, prof, net, s, n)
            row["efficiency"] = one / row["step_s"]
            rows.append(row)
    return rows


def break_even_bandwidth(c: Compute, prof: Profile, net: Network, base: Scenario, option: Scenario,
                         n: int) -> float | None:
    """The link bandwidth (bytes/s) below which ``option`` (fp16, a scheme: fewer bytes for more
    compute) gives a shorter step at ``n`` ranks than ``base``, over the link of ``base``'s
    method (bisection on the model; None if it never does between 1 kbit/s and 10 Tbit/s)."""
    def gain(beta: float) -> float:
        slow = replace(net, links={base.method: replace(net.links[base.method], beta_bytes_per_s=beta)})
        return predict_step(c, prof, slow, base, n)["step_s"] - predict_step(c, prof, slow, option, n)["step_s"]
    low, high = 125.0, 1.25e12
    if gain(low) <= 0:
        return None
    if gain(high) > 0:
        return high
    for _ in range(200):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if gain(mid) > 0 else (low, mid)
    return low


def gather_scatter_falls_behind(c: Compute, prof: Profile, net: Network, s: Scenario,
                                factor: float = 2.0, limit: int = 1 << 20) -> int | None:
    """The smallest world size at which a gather/scatter method's step takes ``factor`` times a
    ring allreduce's that hides nothing (the registry's first of each), both over the same
    cross-host link; None up to ``limit``, or when the registry has no such pair."""
    star, ring = (next((name for name, m in methods.METHODS.items() if m.transports and m.collective == kind
                        and not m.overlaps_backward), None) for kind in ("star", "ring"))
    if star is None or ring is None:
        return None
    link = net.links.get(s.method) or next(iter(net.links.values()))
    same = replace(net, links={star: link, ring: link})
    on = lambda method, n: predict_step(c, prof, same, replace(s, method=method, hierarchical=False), n)["step_s"]  # noqa: E731
    ratio = lambda n: on(star, n) / on(ring, n)  # noqa: E731
    if ratio(limit) < factor:
        return None
    low, high = 1, limit   # the ratio grows with n: the root's bytes grow, the ring's do not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if ratio(mid) < factor else (low, mid)
    return high
