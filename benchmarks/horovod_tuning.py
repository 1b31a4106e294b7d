"""Horovod's own tuning keys measured where they matter: several ranks per host, hosts joined by
shaped links. One namespace cluster (``testbed.netcluster``), --per-host ranks on each of
--hosts hosts, links at --rate; one job per setting under horovodrun (MPI), interleaved.

    .venv/bin/python benchmarks/horovod_tuning.py [--hosts 2] [--per-host 2] [--rate 1gbit]
        [--model vgg11] [--batch-size 16] [--steps 6] [--epochs 3] [--repeats 2]
        [--out logs/bench-horovod-tuning-YYYYmmdd-HHMMSS] [--tag TAG] [--results benchmarks/results]   # as root

The settings (SETTINGS below) are the package's defaults (hvd_cifar's 5 ms cycle, Horovod's
64 MiB fusion buffer) and one change of one key each: the cycle time, the fusion threshold,
Horovod's autotuner. ``horovod_hierarchical`` is tried too: a CPU build of Horovod refuses it
(one line, exit 2), which the table records instead of a time.

Each round runs every setting once, in an order that rotates from round to round; synthetic
data, the same seed. A run's step time and img/s are hvd_cifar.analysis.summary's steady-state figures
(the epochs after the first), CPU s/image the ranks' mean. Written to the results file
benchmarks/results/horovod_tuning.json (hvd_cifar.measure.results: every run, medians and spreads, and per
round each setting's img/s over the defaults'; a refused or failed run is a failed round with
its one line), whose table is printed.
"""
from __future__ import annotations

import argparse
import os
import time

from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options
from testbed.netcluster import NetCluster
from hvd_cifar.analysis.summary import summarize
from hvd_cifar.runfolder.reader import load_run

# name -> the trainer flags that make it (every other key at its default).
SETTINGS = {
    "defaults": [],
    "cycle 1 ms": ["--horovod-cycle-time-ms", "1"],
    "cycle 20 ms": ["--horovod-cycle-time-ms", "20"],
    "no fusion": ["--horovod-fusion-threshold-mb", "0"],
    "fusion 8 MiB": ["--horovod-fusion-threshold-mb", "8"],
    "autotune": ["--horovod-autotune", "true"],
    "hierarchical": ["--horovod-hierarchical", "true"],
}
FIGURES = {"step_time_s": Figure("step (ms)", ".0f", 1e-3), "images_per_s": Figure("img/s", ".1f"),
           "cpu_s_per_image": Figure("CPU ms/image/rank", ".2f", 1e-3), "of_defaults": Figure("img/s x defaults'", ".3f")}


def flags(args, out: str, name: str, setting: str) -> list[str]:
    return [*jobs.CLUSTER_TRAIN_FLAGS, "--model", args.model, "--dataset", "synthetic", "--batch-size",
            str(args.batch_size), "--synthetic-size", str(args.batch_size * args.hosts * args.per_host * args.steps),
            "--epochs", str(args.epochs), "--max-steps-per-epoch", str(args.steps), "--log-dir",
            os.path.join(out, "runs"), "--run-name", name, *SETTINGS[setting]]


def one_run(cluster, args, out: str, setting: str, round_: int) -> dict:
    name = f"{setting.replace(' ', '-')}-r{round_}"
    np = args.hosts * args.per_host
    argv = cluster.horovodrun_argv(np, flags(args, out, name, setting), per_host=args.per_host)
    done = jobs.run(name, lambda: cluster.exec(0, argv, timeout=args.timeout), check=False,
                    log=os.path.join(out, f"{name}.log"))
    if done.code != 0:
        said = [line for line in done.stdout.splitlines() if "hvd_cifar: error:" in line]
        return {"setting": setting, "round": round_, "code": done.code,
                "note": (said[0].split("hvd_cifar: error: ", 1)[1] if said else f"exit {done.code}")}
    row = summarize(load_run(os.path.join(out, "runs", name)))
    return {"setting": setting, "round": round_, "code": 0, **{k: row[k] for k in
            ("step_time_s", "images_per_s", "cpu_s_per_image", "final_test_acc")}}


@jobs.one_line_errors("horovod_tuning")
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--per-host", type=int, default=2, help="ranks per host (default 2)")
    p.add_argument("--rate", default="1gbit", help="link rate, tc syntax (default 1gbit)")
    jobs.add_options(p, model="vgg11", batch_size=16, steps=6, epochs=3, repeats=2, timeout=900)
    p.add_argument("--out", default=time.strftime("logs/bench-horovod-tuning-%Y%m%d-%H%M%S"))
    add_results_options(p)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = Results("horovod_tuning", args, FIGURES)
    results.sample_noise = False  # its jobs run on a cluster's hosts, not as this process's children
    with NetCluster(args.hosts, rate=args.rate) as cluster:
        for k in range(1, args.repeats + 1):
            for setting in jobs.rotated(list(SETTINGS), k - 1):
                r = one_run(cluster, args, args.out, setting, k)
                if r["code"] == 0:
                    results.add(k, setting, {key: r[key] for key in ("step_time_s", "images_per_s", "cpu_s_per_image")})
                else:
                    results.fail(k, setting, r["note"])
                print(f"round {k} {setting}: " + (f"{r['images_per_s']:.1f} img/s" if r["code"] == 0 else r["note"]),
                      flush=True)
    for setting in list(SETTINGS)[1:]:
        results.derive(f"{setting} / defaults", "of_defaults",
                       lambda r, s=setting: r[s]["images_per_s"] / r["defaults"]["images_per_s"])
    path = results.write()
    print(render_docs.render_block(os.path.basename(path), os.path.dirname(path)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
