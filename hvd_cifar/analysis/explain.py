"""Where the time went between a run at np=1 and the same configuration at np=N (the report's
section of that name, docs/REPORTS.md): the gap to ideal img/s split into compute, exposed
communication, data and idle, and the scaling model's answers on the link the run's own
communication implies: for each compression its method runs (fp16, the schemes of
hvd_cifar/compress/), the link bandwidth below which it would shorten this run's step, and the
worker count at which gather/scatter's step takes twice ring allreduce's. The model is
hvd_cifar.analysis.scaling's; here, only what the report asks of it."""
from __future__ import annotations

import math
from dataclasses import replace

from hvd_cifar.core import methods, schemes
from hvd_cifar.runfolder.reader import Run
from hvd_cifar.analysis.scaling import (Compute, Link, Network, Scenario, as_run, break_even_bandwidth,
                                        gather_scatter_falls_behind, measure, predict_step, profile, time_schemes, with_overlap)


def effective_link(c: Compute, prof, s: Scenario, n: int, comm: float) -> Link:
    """The link a run's own communication implies, latency taken as 0: the β at which the
    model gives the measured ``comm`` seconds per synchronisation for the run as it ran (``s``:
    its method, compression, frozen blocks)."""
    unit = Link(0.0, 1.0)
    at_one_byte_per_s = predict_step(c, prof, Network({s.method: unit}, unit), s, n)["comm_s_per_sync"]
    return Link(0.0, at_one_byte_per_s / comm if comm > 0 else math.inf, source=f"effective, from the np={n} run")


def step_parts(c: Compute) -> dict:
    """One micro-batch step of a run in the report's four parts (seconds): compute (forward,
    backward, optimizer), exposed communication (the wait in synchronize(), or the recorded
    comm_exposed_s), data, and idle (the rest: bookkeeping, a wait that moved no bytes)."""
    k = c.accumulation_steps
    exposed = c.sync_s / k if c.exposed_s is None else c.exposed_s
    parts = {"compute": c.forward_s + c.backward_s + c.optimizer_s / k, "exposed communication": exposed, "data": c.data_s}
    parts["idle"] = c.step_s - sum(parts.values())
    return parts


def options(ran: Scenario, config: dict) -> list[Scenario]:
    """What the run could have done instead: each compression of the registry its method runs
    (core.methods.runs: fp16, and where it runs schemes, those that replace averaging), at the
    run's ``config``'s settings of theirs (else their defaults), the run's own left out."""
    plain = replace(ran, compression="none", settings=(), scheme_s=0.0)
    asked = [replace(plain, compression=name, settings=tuple(schemes.of(name, config).items()))
             for name in schemes.names() if name != "none" and methods.runs(ran.method, name)]
    return [o for o in asked if o.label != ran.label]


def explain(multi: Run, single: Run) -> dict:
    """Ideal against measured img/s of ``multi`` (np=N) with the np=1 run ``single`` of the same
    configuration beside it, the gap split by step_parts, and the model's answers on the link
    the run's own communication implies (effective_link): per option (fp16, each scheme), the
    link bandwidth below which it would shorten this run's step (None: on no link), and the
    worker count at which gather/scatter takes twice ring allreduce's step. A method the model
    cannot price is a PredictError, one line (core.methods.priced)."""
    cn, c1 = measure(multi), measure(single)
    methods.priced(cn.sync)
    n = cn.world_size
    ideal, measured = n * c1.images_per_step / c1.step_s, n * cn.images_per_step / cn.step_s
    parts_n, parts_1 = step_parts(cn), step_parts(c1)
    gap_s = cn.step_s - c1.step_s
    rows = [{"part": k, "np1_ms": parts_1[k] * 1e3, "npN_ms": parts_n[k] * 1e3, "delta_ms": (parts_n[k] - parts_1[k]) * 1e3,
             "img_s_lost": (ideal - measured) * (parts_n[k] - parts_1[k]) / gap_s if gap_s else 0.0} for k in parts_n]
    prof = profile(cn.model, cn.num_classes)
    ran = as_run(cn, multi.config)
    ran, *others = time_schemes(prof, [ran, *options(ran, multi.config)], cn.threads_per_rank)
    comm = cn.comm_s if cn.comm_s is not None else max(cn.sync_s - ran.scheme_s, 0.0)  # the wire's share of the wait
    link = effective_link(c1, prof, ran, n, comm)
    net = Network({cn.sync: link}, None)
    base = with_overlap(c1, cn)  # compute as at np=1, overlap as measured at N
    return {"np": n, "ideal_images_per_s": ideal, "measured_images_per_s": measured, "parts": rows, "link": link,
            "break_even_bytes_per_s": {o.label: break_even_bandwidth(base, prof, net, ran, o, n) for o in others},
            "gather_scatter_2x_np": gather_scatter_falls_behind(base, prof, net, Scenario(
                cn.sync, "none", cn.accumulation_steps, cn.frozen_blocks))}
