"""What a sweep (``hvd_cifar.bench``) runs: its configurations, the cartesian products of the swept
options (the main sweep's, then each --also sweep's), and each job's trainer flags, with the
run name that says its configuration and round.

    configs = configurations(args)          # [{"model": ..., "world_size": 2, "dataset": ...}, ...]
    flags = train_flags(cfg, args, "OUT/runs", unique_name("OUT/runs", f"{run_name(cfg)}-r1", taken), extra)

A bad option is a BenchError, one line naming it.
"""
from __future__ import annotations

import argparse
import itertools
import os
import shlex

from hvd_cifar.core import config as config_mod
from hvd_cifar.core import methods, schemes
from hvd_cifar.core.argtypes import freeze_value, positive
from hvd_cifar.core.errors import ConfigError

# Swept options: (bench flag / row key, trainer flag)
SWEEP = (("model", "--model"), ("sync", "--sync"), ("batch_size", "--batch-size"),
         ("compression", "--compression"), ("accumulation_steps", "--accumulation-steps"),
         ("freeze", "--freeze"), ("world_size", None))
# Trainer keys the bench sets itself; --extra may not override them or the table would lie.
OWNED_KEYS = ("model", "sync", "batch_size", "compression", "accumulation_steps", "freeze",
              "dataset", "epochs", "max_steps_per_epoch", "target_acc", "log_dir", "run_name", "resume",
              "progress")


class BenchError(RuntimeError):
    """A bad option; the message is one line naming it."""


def add_sweep_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The options whose values span a cartesian product; an --also sweep's have no defaults
    (what it leaves out, it takes from the main sweep)."""
    d = (lambda v: v) if defaults else (lambda v: None)
    p.add_argument("--np", nargs="+", type=positive, default=d([1, 2]), help="process counts (default: 1 2)")
    p.add_argument("--sync", nargs="+", choices=methods.names(), default=d([methods.names()[0]]),
                   help="sync methods (core/methods.py; default: %(default)s)")
    p.add_argument("--model", nargs="+", choices=config_mod.MODELS, default=d(["smallcnn"]))
    p.add_argument("--batch-size", nargs="+", type=positive, default=d([32]), help="images per rank per step")
    p.add_argument("--compression", nargs="+", choices=schemes.names(), default=d([schemes.names()[0]]),
                   help="gradient compressions (core/schemes.py; default: %(default)s; their own keys through --extra)")
    p.add_argument("--accumulation-steps", nargs="+", type=positive, default=d([1]))
    p.add_argument("--freeze", nargs="+", type=freeze_value, default=d([0]),
                   help="leading frozen blocks, or auto (freeze_auto_threshold from --extra)")


class AlsoParser(argparse.ArgumentParser):
    """The options of one --also sweep; a mistake is a BenchError naming --also."""

    def error(self, message: str):
        raise BenchError(f"--also: {message}")


def sweep_values(options: argparse.Namespace) -> dict[str, list]:
    """One sweep's values by row key, in SWEEP's order (world_size last: np varies fastest)."""
    return {key: getattr(options, "np" if key == "world_size" else key) for key, _ in SWEEP}


def also_sweep(main: dict[str, list], text: str) -> dict[str, list]:
    """An --also "OPTIONS" sweep: the options given there, the rest from the main sweep."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise BenchError(f"--also: cannot split {text!r} ({exc})") from None
    parser = AlsoParser(prog="--also", add_help=False)
    add_sweep_options(parser, defaults=False)
    given = sweep_values(parser.parse_args(tokens))
    sweep = {key: values if values is not None else main[key] for key, values in given.items()}
    sweep["world_size"] = sorted(set(sweep["world_size"]))
    return sweep


def extra_flags(extra: str) -> list[str]:
    """--extra as an argument list, checked by the trainer's own flag parser."""
    try:
        flags = shlex.split(extra)
    except ValueError as exc:
        raise BenchError(f"--extra: cannot split {extra!r} ({exc})") from None
    try:
        _, updates = config_mod.parse_flags(flags)
    except ConfigError as exc:
        raise BenchError(f"--extra: {exc}") from None
    owned = [k for k in updates if k in OWNED_KEYS]
    if owned:
        raise BenchError(f"--extra: --{owned[0].replace('_', '-')} is set by the bench itself "
                         f"(use the bench's own option, if it has one)")
    return flags


def check_compressions(configs: list[dict], extra: list[str]) -> None:
    """Each configuration's trainer flags read back as its compression: an older spelling in
    --extra (core.aliases: fp16_allreduce, local_sgd_steps as local SGD's switch) would change
    it behind the table's back, or conflict with it."""
    for compression in dict.fromkeys(cfg["compression"] for cfg in configs):
        try:
            layer = config_mod.layers(["--compression", compression, *extra])[-1][0]
        except ConfigError as exc:
            raise BenchError(f"--extra: {exc}") from None
        if layer["compression"] != compression:
            raise BenchError(f"--extra: reads as compression: {layer['compression']} beside the sweep's "
                             f"--compression {compression}; sweep it with --compression")


def configurations(args) -> list[dict]:
    """The main sweep's cartesian product, then each --also sweep's, np varying fastest; a
    configuration asked for twice runs once."""
    configs: list[dict] = []
    for sweep in (sweep_values(args), *args.also):
        for combo in itertools.product(*sweep.values()):
            cfg = dict(zip(sweep, combo), dataset=args.dataset)
            if cfg not in configs:
                configs.append(cfg)
    return configs


def run_name(cfg: dict) -> str:
    return (f"{cfg['model']}-{cfg['dataset']}-{cfg['sync']}-np{cfg['world_size']}-b{cfg['batch_size']}"
            f"-{cfg['compression']}-acc{cfg['accumulation_steps']}-frz{cfg['freeze']}")


def unique_name(runs_dir: str, name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken or os.path.exists(os.path.join(runs_dir, candidate)):
        n += 1
        candidate = f"{name}-{n}"
    taken.add(candidate)
    return candidate


def train_flags(cfg: dict, args, runs_dir: str, name: str, extra: list[str]) -> list[str]:
    flags = [flag_arg for key, flag in SWEEP if flag
             for flag_arg in (flag, str(cfg[key]).lower() if isinstance(cfg[key], bool) else str(cfg[key]))]
    return [*flags, "--dataset", args.dataset, "--epochs", str(args.epochs),
            "--max-steps-per-epoch", str(args.steps), "--target-acc", str(args.target_acc),
            "--log-dir", runs_dir, "--run-name", name, "--progress", "false", *extra]
