"""Predict step time, img/s, scaling efficiency and bytes per rank at worker counts you do not
have, from one run's measured phases and a network probe. The model is hvd_cifar.analysis.scaling's
(docs/SCALING.md); here: reading the probe and the run folders into it, its table and figure.

    python -m hvd_cifar.predict logs/RUN --probe probe.json --np 1 2 4 8 16 32 64 128 256 512 1024
    python -m hvd_cifar.predict logs/RUN --probe probe.json --np 1 2 4 --sync horovod mpi-gather-scatter \\
        --fp16-allreduce --accumulation-steps 4 --freeze 2 --measured logs/np2 logs/np4
    python -m hvd_cifar.predict logs/RUN --bandwidth 1gbit --latency-us 50 --np 2 4 8   # no probe: a link you name
    python -m hvd_cifar.predict logs/RUN --bandwidth 100mbit --np 2 4 8 --compression fp16 powersgd topk \
        --local-sgd-steps 4                                                              # the schemes of hvd_cifar/compress/

``probe.json`` comes from ``python -m hvd_cifar.probe`` (launched like training, on your hosts).
``--measured`` run folders (other np, same model) are overlaid on the plot and, where one
matches a predicted row (sync, np, fp16, accumulation, freeze), put beside it with the error.
Writes OUT/predict.csv and OUT/predict.png (OUT: --out, default RUN/predict), prints the table.
Bad input is one ``hvd_cifar: error:`` line and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from hvd_cifar.analysis.plots import plot_prediction
from hvd_cifar.compress import registry
from hvd_cifar.core import units
from hvd_cifar.core.errors import PredictError, ReportError
from hvd_cifar.core.files import RunError
from hvd_cifar.core.names import COMPRESSIONS, SCHEME_SYNC_METHODS
from hvd_cifar.runfolder.reader import load_run
from hvd_cifar.analysis.scaling import (SCENARIO_KEYS, TRANSPORTS, Compute, Link, Network, Scenario, measure, predict,
                               profile, scheme_of, time_schemes)
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


def network(methods: list[str], args: argparse.Namespace) -> Network:
    """Links per method: --bandwidth/--latency-us for all, else the probe's fit of each
    method's transport (TRANSPORTS)."""
    if args.bandwidth:
        try:
            beta = units.parse_rate(args.bandwidth) / 8
        except ValueError as exc:
            raise PredictError(f"--bandwidth: {exc}") from None
        link = Link(args.latency_us * 1e-6, beta, 0.0, f"--bandwidth {args.bandwidth} --latency-us {args.latency_us:g}")
        return Network({m: link for m in methods}, None, args.ranks_per_host, shared_cores=args.shared_cores)
    if not args.probe:
        raise PredictError("no network: give --probe probe.json (python -m hvd_cifar.probe) or --bandwidth RATE")
    probe = read_probe(args.probe)
    links = {}
    for m in methods:
        found = [t for t in TRANSPORTS[m] if t in probe["transports"]]
        if not found:
            raise PredictError(f"{args.probe}: no {' or '.join(TRANSPORTS[m])} timings for --sync {m} "
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
        rows.append({"run": s["run"], "method": s["sync"], "np": s["world_size"],
                     "fp16_allreduce": bool(s["fp16_allreduce"]), "accumulation_steps": int(s["accumulation_steps"]),
                     "freeze": int(run.metrics[-1].get("frozen_blocks", 0)),
                     "compression": scheme_label(scheme_of(run.config)),
                     "step_s": s["step_time_s"], "images_per_s": s["images_per_s"]})
    return rows


def scheme_label(scheme: dict) -> str:
    """A Scenario's scheme fields (scaling.scheme_of) as its table cell."""
    return registry.label(scheme["compression"], scheme["local_sgd_steps"], dict(scheme["settings"]))


def attach_measured(rows: list[dict], measured: list[dict]) -> None:
    """Put each measured run beside the predicted row of its scenario: measured step and error."""
    for row in rows:
        match = [m for m in measured if all(m[k] == row[k] for k in SCENARIO_KEYS)]
        if match:
            row["measured_step_s"] = sum(m["step_s"] for m in match) / len(match)
            row["error_pct"] = 100 * (row["step_s"] - row["measured_step_s"]) / row["measured_step_s"]


# ----------------------------------------------------------------------------- output
COLUMNS = [
    Column("method", "method"), Column("np", "np", numeric=True),
    Column("fp16", "fp16_allreduce"), Column("accum", "accumulation_steps", numeric=True),
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


# ----------------------------------------------------------------------------- command line
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m hvd_cifar.predict", description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN_DIR", help="run folder whose phases are the compute (best: np=1)")
    p.add_argument("--probe", help="probe.json from python -m hvd_cifar.probe")
    p.add_argument("--bandwidth", help="instead of a probe: link rate, bits per second (1e9) or tc syntax (1gbit, 100mbit)")
    p.add_argument("--latency-us", type=float, default=50.0, help="with --bandwidth: α in µs (default 50)")
    p.add_argument("--np", type=int, nargs="+", default=list(DEFAULT_NP), help="world sizes")
    p.add_argument("--sync", nargs="+", choices=list(TRANSPORTS), help="methods (default: the run's)")
    p.add_argument("--fp16-allreduce", action="store_true", help="predict with fp16 gradients too")
    p.add_argument("--accumulation-steps", type=int, help="predict with k micro-batches per sync too")
    p.add_argument("--freeze", type=int, help="predict with n leading blocks frozen too")
    p.add_argument("--compression", nargs="+", choices=list(COMPRESSIONS), default=[],
                   help="predict with each of these gradient compressions too (powersgd, topk: horovod and ddp)")
    p.add_argument("--local-sgd-steps", type=int, metavar="H", help="predict local SGD too (models averaged every H updates)")
    for key, (scheme, setting) in registry.settings().items():  # the settings that shape a scheme's bytes
        if setting.bytes:
            p.add_argument(f"--{key.replace('_', '-')}", type=setting.kind, default=setting.default,
                           help=f"with --compression {scheme} (default {setting.default}): {setting.meaning}")
    p.add_argument("--ranks-per-host", type=int, default=1, help="for horovod-hierarchical (default 1)")
    p.add_argument("--shared-cores", type=int, default=0, metavar="C",
                   help="every rank runs on one machine with C cores (the namespace cluster, an "
                        "oversubscribed node): compute slows by np·threads_per_rank/C beyond C (default: "
                        "each rank has cores of its own)")
    p.add_argument("--overlap-from", metavar="RUN_DIR", help="take the hidden fraction from this run (e.g. "
                   "np=2 with comm_timeline) and the compute from RUN_DIR (e.g. np=1, which has nothing to hide)")
    p.add_argument("--measured", nargs="*", default=[], metavar="RUN_DIR", help="runs to overlay and compare")
    p.add_argument("--out", help="output folder (default RUN_DIR/predict)")
    args = p.parse_args(argv)
    if min(args.np) < 1 or args.ranks_per_host < 1 or (args.accumulation_steps or 1) < 1 or min(args.freeze or 0, args.shared_cores) < 0:
        p.error("--np, --ranks-per-host and --accumulation-steps must be >= 1, --freeze and --shared-cores >= 0")
    if (args.local_sgd_steps or 2) < 2:
        p.error("--local-sgd-steps must be >= 2")
    for key, (_, setting) in registry.settings().items():
        if setting.bytes and not setting.allowed(getattr(args, key)):
            p.error(f"--{key.replace('_', '-')}: {setting.rule}, got {getattr(args, key)}")
    return args


def with_schemes(plain: list[Scenario], args: argparse.Namespace) -> list[Scenario]:
    """``plain`` and each of its scenarios again under each --compression and --local-sgd-steps
    asked for; powersgd, topk and local SGD only for the methods that run them (horovod, ddp)."""
    asked = [{"fp16": name == "fp16", "compression": "none" if name == "fp16" else name, "local_sgd_steps": 1}
             for name in args.compression]
    if args.local_sgd_steps:
        asked.append({"fp16": False, "compression": "none", "local_sgd_steps": args.local_sgd_steps})
    runs_schemes = [s for s in plain if s.method in SCHEME_SYNC_METHODS]
    if any(a["compression"] != "none" or a["local_sgd_steps"] > 1 for a in asked) and not runs_schemes:
        raise PredictError(f"--compression/--local-sgd-steps: powersgd, topk and local SGD run under "
                           f"{' and '.join(SCHEME_SYNC_METHODS)}; give one of them in --sync")
    more = [replace(s, **a, settings=tuple(registry.of(a["compression"], vars(args)).items())) for s in plain
            for a in asked if s in runs_schemes or (a["compression"] == "none" and a["local_sgd_steps"] == 1)]
    return list(dict.fromkeys(plain + more))


def scenarios(c: Compute, args: argparse.Namespace, depth: int, run_scheme: dict | None = None) -> list[Scenario]:
    """Each method as the run ran (``run_scheme``: its scheme_of), then with each option asked
    for, then with all of them; then each of those with each scheme asked for (with_schemes)."""
    if args.freeze is not None and args.freeze > depth:
        raise PredictError(f"--freeze: {args.freeze} blocks asked for but {c.model} has {depth}")
    fp16, k, frozen = as_run = (c.fp16, c.accumulation_steps, c.frozen_blocks)
    options = [as_run]
    if args.fp16_allreduce:
        options.append((True, k, frozen))
    if args.accumulation_steps:
        options.append((fp16, args.accumulation_steps, frozen))
    if args.freeze is not None:
        options.append((fp16, k, args.freeze))
    options.append((args.fp16_allreduce or fp16, args.accumulation_steps or k,
                    frozen if args.freeze is None else args.freeze))  # every option asked for at once
    unique = list(dict.fromkeys(options))
    plain = [Scenario(m, f, k, z, **(run_scheme or {})) for m in (args.sync or [c.sync]) for f, k, z in unique]
    return with_schemes(plain, args)


def run(args: argparse.Namespace) -> tuple[list[dict], str]:
    source = load_run(args.run)
    c = measure(source)
    if args.overlap_from:
        c = replace(c, hidden_fraction=measure(load_run(args.overlap_from)).hidden_fraction)
    if c.sync not in TRANSPORTS and not args.sync:
        raise PredictError(f"{args.run}: sync {c.sync} has no model here; pick --sync from {', '.join(TRANSPORTS)}")
    if args.shared_cores and not c.threads_per_rank:
        raise PredictError(f"--shared-cores: {args.run} chose its threads per rank from its host's cores; "
                           "use a run with threads_per_rank set")
    prof = profile(c.model, c.num_classes)
    wanted = time_schemes(prof, scenarios(c, args, len(prof.block_params), scheme_of(source.config)), c.threads_per_rank)
    net = network(list(dict.fromkeys(s.method for s in wanted)), args)
    rows = predict(c, prof, net, wanted, sorted(set(args.np)))
    measured = measured_rows(args.measured)
    attach_measured(rows, measured)
    out = args.out or os.path.join(args.run, "predict")
    os.makedirs(out, exist_ok=True)
    write_csv(os.path.join(out, "predict.csv"), COLUMNS, rows)
    sources = "; ".join(sorted({link.source for link in net.links.values()}))
    plot_prediction(rows, measured, os.path.join(out, "predict.png"), f"{c.model}, compute from {os.path.basename(os.path.normpath(args.run))} "
         f"(np={c.world_size}); network: {sources}")
    head = (f"compute from {args.run} (np={c.world_size}, {c.sync}): {c.step_s * 1e3:.2f} ms/step measured, "
            f"hidden fraction {'not recorded (modelled from the order backward makes the gradients ready)' if c.hidden_fraction is None else f'{c.hidden_fraction:.2f}'}"
            f"{f' (from {args.overlap_from})' if args.overlap_from else ''}; "
            f"network: {sources}"
            f"{f'; all ranks on {args.shared_cores} cores, {c.threads_per_rank} thread(s) each' if args.shared_cores else ''}\n")
    return rows, head + markdown_table(COLUMNS, rows) + f"\nwritten to {out}/predict.csv and predict.png"


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
