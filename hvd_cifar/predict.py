"""Predict step time, img/s, scaling efficiency and bytes per rank at worker counts you do not
have, from one run's measured phases and a network probe. The model is hvd_cifar.analysis.scaling's
(docs/SCALING.md); here: reading the probe and the run folders into it, its table and figure.

    python -m hvd_cifar.predict logs/RUN --probe probe.json --np 1 2 4 8 16 32 64 128 256 512 1024
    python -m hvd_cifar.predict logs/RUN --probe probe.json --np 1 2 4 --sync horovod mpi-gather-scatter \\
        --compression fp16 --accumulation-steps 4 --freeze 2 --measured logs/np2 logs/np4
    python -m hvd_cifar.predict logs/RUN --bandwidth 1gbit --latency-us 50 --np 2 4 8   # no probe: a link you name
    python -m hvd_cifar.predict logs/RUN --bandwidth 100mbit --np 2 4 8 --compression fp16 powersgd topk \
        local-sgd --local-sgd-steps 4                                  # the compressions of core/schemes.py
    python -m hvd_cifar.predict logs/RUN --probe probe.json --np 8 16 --hierarchical --ranks-per-host 4
    python -m hvd_cifar.predict logs/RUN --bandwidth 1gbit --accuracy-from logs/none logs/powersgd logs/topk \
        --at-rates 100mbit 20mbit   # runs made on a 1gbit link: per scheme its time to their target_acc
                                    # at each rate, and the rate below which it gets there sooner

``probe.json`` comes from ``python -m hvd_cifar.probe`` (launched like training, on your hosts).
The methods and compressions, how each is priced and which runs which, are the registries'
(hvd_cifar/core/methods.py, hvd_cifar/core/schemes.py); a method whose entry names no transport
the probe times is refused in one line. ``--measured`` run folders (other np, same model) are
overlaid on the plot and, where one matches a predicted row (sync, hierarchical, np,
compression, accumulation, freeze), put beside it with the error. ``--accuracy-from`` runs (the
same model and ranks, each with target_acc, one uncompressed, made on the network that --probe or
--bandwidth describes) give each scheme's measured epochs to the target, and with them its time to
it at --at-rates and the rate below which it gets there sooner (hvd_cifar.analysis.crossover;
OUT/crossover.csv).
Writes OUT/predict.csv and OUT/predict.png (OUT: --out, default RUN/predict), prints the table.
Bad input is one ``hvd_cifar: error:`` line and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from hvd_cifar.analysis import crossover
from hvd_cifar.analysis.plots import plot_prediction
from hvd_cifar.core import methods, schemes, units
from hvd_cifar.core.errors import PredictError, ReportError
from hvd_cifar.core.files import RunError
from hvd_cifar.runfolder.reader import load_run
from hvd_cifar.analysis.scaling import (SCENARIO_KEYS, Compute, Link, Network, Scenario, as_run, compression_of,
                                        hierarchical_of, measure, predict, profile, time_schemes, with_overlap)
from hvd_cifar.analysis.summary import MB, summarize
from hvd_cifar.analysis.tabulate import Column, OneLineParser, markdown_table, num, write_csv

DEFAULT_NP = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


# ----------------------------------------------------------------------------- the network
def read_probe(path: str) -> dict:
    try:
        with open(path) as f:
            probe = json.load(f)
    except (OSError, ValueError) as exc:
        raise PredictError(f"{path}: cannot be read ({str(exc).splitlines()[0]})") from None
    if not isinstance(probe, dict) or not isinstance(probe.get("transports"), dict):
        raise PredictError(f"{path}: not a probe.json (no 'transports'; made by python -m hvd_cifar.probe)")
    return probe


def probe_link(probe: dict, name: str, path: str) -> Link:
    fit = probe["transports"][name]
    return Link(fit["alpha_s"], fit["beta_bytes_per_s"], probe.get("reduce_s_per_byte", 0.0),
                f"{os.path.basename(path)}: {name} ({fit.get('scope', '?')}, {probe.get('world_size', '?')} ranks)",
                fit.get("per_op_s", 0.0))


def network(names: list[str], args: argparse.Namespace) -> Network:
    """Links per method: --bandwidth/--latency-us for all, else the probe's fit of the first of
    the method's transports (its registry entry's) that the probe holds."""
    if args.bandwidth:
        try:
            beta = units.parse_rate(args.bandwidth) / 8
        except ValueError as exc:
            raise PredictError(f"--bandwidth: {exc}") from None
        link = Link(args.latency_us * 1e-6, beta, 0.0, f"--bandwidth {args.bandwidth} --latency-us {args.latency_us:g}")
        return Network({m: link for m in names}, None, args.ranks_per_host, shared_cores=args.shared_cores)
    if not args.probe:
        raise PredictError("no network: give --probe probe.json (python -m hvd_cifar.probe) or --bandwidth RATE")
    probe = read_probe(args.probe)
    links = {}
    for m in names:
        transports = methods.priced(m).transports
        found = [t for t in transports if t in probe["transports"]]
        if not found:
            raise PredictError(f"{args.probe}: no {' or '.join(transports)} timings for --sync {m} "
                               f"(it has: {', '.join(probe['transports']) or 'none'})")
        links[m] = probe_link(probe, found[0], args.probe)
    local = probe_link(probe, "mpi-intra-host", args.probe) if "mpi-intra-host" in probe["transports"] else None
    return Network(links, local, args.ranks_per_host, shared_cores=args.shared_cores)


# ----------------------------------------------------------------------------- measured points
def measured_rows(paths: list[str]) -> list[dict]:
    """Steady-state step time and img/s of other runs (hvd_cifar.analysis.summary's)."""
    rows = []
    for path in paths:
        run = load_run(path)
        s = summarize(run)
        compression, settings = compression_of(run.config)
        rows.append({"run": s["run"], "method": s["sync"], "hierarchical": hierarchical_of(s["sync"], run.config),
                     "np": s["world_size"], "accumulation_steps": int(s["accumulation_steps"]),
                     "freeze": int(run.metrics[-1].get("frozen_blocks", 0)),
                     "compression": schemes.label(compression, dict(settings)),
                     "step_s": s["step_time_s"], "images_per_s": s["images_per_s"]})
    return rows


def attach_measured(rows: list[dict], measured: list[dict]) -> None:
    """Put each measured run beside the predicted row of its scenario: measured step and error."""
    for row in rows:
        match = [m for m in measured if all(m[k] == row[k] for k in SCENARIO_KEYS)]
        if match:
            row["measured_step_s"] = sum(m["step_s"] for m in match) / len(match)
            row["error_pct"] = 100 * (row["step_s"] - row["measured_step_s"]) / row["measured_step_s"]


# ----------------------------------------------------------------------------- output
COLUMNS = [
    Column("method", "method"), Column("hierarchical", "hierarchical"), Column("np", "np", numeric=True),
    Column("accum", "accumulation_steps", numeric=True),
    Column("freeze", "freeze", numeric=True), Column("compression", "compression"),
    num("payload (MB/sync)", "payload_bytes", ".2f", MB),
    num("comm (ms/sync)", "comm_s_per_sync", ".2f", 1e-3),
    num("exposed (ms/sync)", "exposed_s_per_sync", ".2f", 1e-3),
    num("scheme compute (ms/sync)", "scheme_s_per_sync", ".2f", 1e-3),
    num("step (ms)", "step_s", ".2f", 1e-3),
    num("img/s", "images_per_s", ".1f"),
    num("efficiency", "efficiency", ".3f"),
    num("bytes/rank/step (MB)", "bytes_per_rank_per_step", ".3f", MB),
    num("measured step (ms)", "measured_step_s", ".2f", 1e-3),
    num("error (%)", "error_pct", "+.1f"),
]
CROSSOVER_COLUMNS = [Column("compression", "compression"), Column("run", "run"),
                     num("epochs to target", "epochs_to_target", ".0f")]


# ----------------------------------------------------------------------------- command line
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m hvd_cifar.predict", description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN_DIR", help="run folder whose phases are the compute (best: np=1)")
    p.add_argument("--probe", help="probe.json from python -m hvd_cifar.probe")
    p.add_argument("--bandwidth", help="instead of a probe: link rate, bits per second (1e9) or tc syntax (1gbit, 100mbit)")
    p.add_argument("--latency-us", type=float, default=50.0, help="with --bandwidth: α in µs (default 50)")
    p.add_argument("--np", type=int, nargs="+", default=list(DEFAULT_NP), help="world sizes")
    p.add_argument("--sync", nargs="+", choices=methods.names(),
                   help=f"methods (default: the run's; priced: {', '.join(priced_methods())})")
    p.add_argument("--accumulation-steps", type=int, help="predict with k micro-batches per sync too")
    p.add_argument("--freeze", type=int, help="predict with n leading blocks frozen too")
    p.add_argument("--compression", nargs="+", choices=schemes.names(), default=[],
                   help=f"predict with each of these compressions too ({', '.join(schemes.replacing())}: under "
                        f"{', '.join(methods.with_capability('runs_schemes'))})")
    for key, (scheme, setting) in schemes.settings().items():  # the settings that shape a scheme's bytes
        if setting.bytes:
            p.add_argument(f"--{key.replace('_', '-')}", type=setting.kind, default=setting.default,
                           help=f"with --compression {scheme} (default {setting.default}): {setting.meaning}")
    p.add_argument("--hierarchical", action="store_true",
                   help=f"predict the hierarchical allreduce too, where a method has one "
                        f"({', '.join(m for m, spec in methods.METHODS.items() if spec.hierarchical_key)})")
    p.add_argument("--ranks-per-host", type=int, default=1, help="for the hierarchical allreduce (default 1)")
    p.add_argument("--shared-cores", type=int, default=0, metavar="C",
                   help="every rank runs on one machine with C cores (the namespace cluster, an "
                        "oversubscribed node): compute slows by np·threads_per_rank/C beyond C (default: "
                        "each rank has cores of its own)")
    p.add_argument("--overlap-from", metavar="RUN_DIR", help="take the hidden fraction from this run (e.g. "
                   "np=2 with comm_timeline) and the compute from RUN_DIR (e.g. np=1, which has nothing to hide)")
    p.add_argument("--measured", nargs="*", default=[], metavar="RUN_DIR", help="runs to overlay and compare")
    p.add_argument("--accuracy-from", nargs="+", default=[], metavar="RUN_DIR",
                   help="accuracy runs, one per compression (one of them none), each with target_acc: per scheme "
                        "its time to the target here and the link rate below which it gets there sooner")
    p.add_argument("--at-rates", nargs="+", default=[], metavar="RATE",
                   help="with --accuracy-from: each run's time to the target at these link rates too (tc syntax)")
    p.add_argument("--out", help="output folder (default RUN_DIR/predict)")
    args = p.parse_args(argv)
    if min(args.np) < 1 or args.ranks_per_host < 1 or (args.accumulation_steps or 1) < 1 or min(args.freeze or 0, args.shared_cores) < 0:
        p.error("--np, --ranks-per-host and --accumulation-steps must be >= 1, --freeze and --shared-cores >= 0")
    for key, (_, setting) in schemes.settings().items():
        if setting.bytes and not setting.allowed(getattr(args, key)):
            p.error(f"--{key.replace('_', '-')}: {setting.rule}, got {getattr(args, key)}")
    return args


def priced_methods() -> list[str]:
    """The methods the scaling model can price: their registry entry names a transport."""
    return [m for m, spec in methods.METHODS.items() if spec.transports]


def asked_methods(c: Compute, args: argparse.Namespace) -> list[str]:
    """--sync, else the run's method: each one the model can price (core.methods.priced), else
    one line why."""
    if args.sync:
        for m in args.sync:
            methods.priced(m)
        return list(dict.fromkeys(args.sync))
    try:
        methods.priced(c.sync)
    except PredictError as exc:
        raise PredictError(f"{args.run}: {exc}; pick --sync from {', '.join(priced_methods())}") from None
    return [c.sync]


def scenarios(c: Compute, args: argparse.Namespace, names: list[str], depth: int, config: dict) -> list[Scenario]:
    """Each of the methods ``names`` as the run ran (its compression and the scheme's settings,
    from ``config``, its saved config), then with each option asked for, then with all of them;
    each of those again under each --compression, and with --hierarchical where the method has
    one. A method takes only the compressions it runs (core.methods.runs)."""
    if args.freeze is not None and args.freeze > depth:
        raise PredictError(f"--freeze: {args.freeze} blocks asked for but {c.model} has {depth}")
    for name in args.compression:
        if not any(methods.runs(m, name) for m in names):
            runners = [m for m in methods.names() if methods.runs(m, name)]
            raise PredictError(f"--compression {name}: runs under {', '.join(runners)}; give one of them in --sync")
    k, frozen = c.accumulation_steps, c.frozen_blocks
    options = [(k, frozen)]
    if args.accumulation_steps:
        options.append((args.accumulation_steps, frozen))
    if args.freeze is not None:
        options.append((k, args.freeze))
    options.append((args.accumulation_steps or k, frozen if args.freeze is None else args.freeze))  # every option at once
    ran = as_run(c, config)
    plain = [replace(ran, method=m, hierarchical=hierarchical_of(m, config), accumulation_steps=a, freeze=z)
             for m in names for a, z in dict.fromkeys(options)]
    found = [s for s in plain + [replace(s, compression=name, settings=tuple(schemes.of(name, vars(args)).items()))
                                 for s in plain for name in args.compression] if methods.runs(s.method, s.compression)]
    for m in names:
        if not any(s.method == m for s in found):
            raise PredictError(f"--sync {m}: runs neither the run's compression ({ran.compression}) nor one of "
                               f"--compression; add --compression none")
    return with_hierarchical(list(dict.fromkeys(found)), args)


def with_hierarchical(found: list[Scenario], args: argparse.Namespace) -> list[Scenario]:
    """``found`` and, with --hierarchical, each of them again with the hierarchical allreduce where
    its method has one (its registry entry's hierarchical_key)."""
    if not args.hierarchical:
        return found
    more = [replace(s, hierarchical=True) for s in found if methods.METHODS[s.method].hierarchical_key]
    if not more:
        raise PredictError(f"--hierarchical: no method of --sync has one "
                           f"({', '.join(m for m, spec in methods.METHODS.items() if spec.hierarchical_key)} has)")
    return list(dict.fromkeys(found + more))


def run(args: argparse.Namespace) -> tuple[list[dict], str]:
    source = load_run(args.run)
    c = measure(source)
    if args.overlap_from:
        c = with_overlap(c, measure(load_run(args.overlap_from)), args.shared_cores)
    if args.shared_cores and not c.threads_per_rank:
        raise PredictError(f"--shared-cores: {args.run} chose its threads per rank from its host's cores; "
                           "use a run with threads_per_rank set")
    names = asked_methods(c, args)
    prof = profile(c.model, c.num_classes)
    wanted = time_schemes(prof, scenarios(c, args, names, len(prof.block_params), source.config), c.threads_per_rank)
    net = network(list(dict.fromkeys(s.method for s in wanted)), args)
    rows = predict(c, prof, net, wanted, sorted(set(args.np)))
    measured = measured_rows(args.measured)
    attach_measured(rows, measured)
    out = args.out or os.path.join(args.run, "predict")
    os.makedirs(out, exist_ok=True)
    write_csv(os.path.join(out, "predict.csv"), COLUMNS, rows)
    shown = [col for col in COLUMNS if col.key != "hierarchical" or any(r["hierarchical"] for r in rows)]
    sources = "; ".join(sorted({link.source for link in net.links.values()}))
    plot_prediction(rows, measured, os.path.join(out, "predict.png"), f"{c.model}, compute from {os.path.basename(os.path.normpath(args.run))} "
         f"(np={c.world_size}); network: {sources}")
    head = (f"compute from {args.run} (np={c.world_size}, {c.sync}): {c.step_s * 1e3:.2f} ms/step measured, "
            f"hidden fraction {'not recorded (modelled from the order backward makes the gradients ready)' if c.hidden_fraction is None else f'{c.hidden_fraction:.2f}'}"
            f"{f' (from {args.overlap_from}; backward slowed {c.contention:.2f} s per s hidden)' if args.overlap_from else ''}; "
            f"network: {sources}"
            f"{f'; all ranks on {args.shared_cores} cores, {c.threads_per_rank} thread(s) each' if args.shared_cores else ''}\n")
    text = head + markdown_table(shown, rows) + f"\nwritten to {out}/predict.csv and predict.png"
    if args.accuracy_from:
        text += "\n\n" + crossover_text(c, prof, args, out)
    return rows, text


def crossover_text(c, prof, args: argparse.Namespace, out: str) -> str:
    """The --accuracy-from table: each run's scheme, epochs to the target, time to it on the runs'
    own network and at each --at-rates rate, and the rate below which it is sooner (written to
    OUT/crossover.csv)."""
    runs = [load_run(path) for path in args.accuracy_from]
    sizes = {summarize(r)["world_size"] for r in runs}
    if len(sizes) != 1:
        raise PredictError(f"--accuracy-from: the runs must share one world size (got {sorted(sizes)})")
    n, net = sizes.pop(), network([c.sync], args)
    try:
        rates = {"their link": net, **{rate: crossover.at_bandwidth(net, c.sync, units.parse_rate(rate) / 8)
                                       for rate in args.at_rates}}
    except ValueError as exc:
        raise PredictError(f"--at-rates: {exc}") from None
    rows = crossover.crossover_rows(c, prof, net, runs, n, rates)
    columns = [*CROSSOVER_COLUMNS, *[num(f"time to target at {label} (s)", f"time_to_target_s@{label}", ".1f")
                                     for label in rates], crossover.SOONER]
    write_csv(os.path.join(out, "crossover.csv"), columns, rows)
    return (f"time to target_acc {runs[0].config.get('target_acc')} at np={n}, from each run's epochs to it "
            f"(measured on {next(iter(net.links.values())).source}):\n"
            + markdown_table(columns, rows) + f"\nwritten to {out}/crossover.csv")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        _, text = run(args)
    except (PredictError, ReportError, RunError) as exc:
        print(f"hvd_cifar: error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
