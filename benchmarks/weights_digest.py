"""Whether a change to the code kept training's arithmetic: every sync method under every
compression scheme it runs trains the tiny config (configs/tiny.yaml: the small CNN on digits,
2 epochs of 6 updates, fp32 NCHW) and the final checkpoint's model, optimizer state and each
rank's scheme state are hashed. Run it before and after a change and compare the two files:
the same digest means the same weights bit for bit.

    .venv/bin/python benchmarks/weights_digest.py --out logs/digest-before.json
    .venv/bin/python benchmarks/weights_digest.py --out logs/digest-after.json --compare logs/digest-before.json
    .venv/bin/python benchmarks/weights_digest.py --out logs/digest-ddp.json --only "ddp np2" --compare logs/digest-before.json

The schemes leave their warm-ups early (compression_warmup_steps 2, topk_warmup_epochs 0) so
that both epochs' updates after the second go through the scheme. The asynchronous parameter
server is not bit for bit between two runs of the same code (the workers' pushes interleave as
they arrive), so it is run and reported, but compared only with itself run twice.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile

import torch

from hvd_cifar.launch import commands
from hvd_cifar.runfolder.checkpoint import CHECKPOINT
from testbed import jobs

SCHEMES = {"none": [], "fp16": ["--compression", "fp16"], "fp16-alias": ["--fp16-allreduce"],
           "powersgd": ["--compression", "powersgd"], "topk": ["--compression", "topk", "--topk-warmup-epochs", "0"],
           "localsgd": ["--local-sgd-steps", "2"]}
CASES = [  # (sync, ranks, scheme, extra flags)
    *[("horovod", 1, s, []) for s in ("none", "fp16")],
    *[("horovod", 2, s, []) for s in SCHEMES],
    ("horovod", 2, "none", ["--accumulation-steps", "2", "--freeze", "1"]),
    *[("ddp", 2, s, []) for s in SCHEMES],
    *[(m, 2, s, []) for m in ("mpi-allreduce", "mpi-gather-scatter") for s in ("none", "fp16")],
    ("mpi-async-ps", 3, "none", []),
    ("mpi-async-ps", 3, "none", []),
]


def digest(value) -> str:
    """sha256 over every tensor and plain value in ``value``, in a fixed order."""
    h = hashlib.sha256()

    def feed(v):
        if isinstance(v, torch.Tensor):
            h.update(str(v.dtype).encode() + str(tuple(v.shape)).encode())
            h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b"")
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                h.update(str(k).encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            for item in v:
                feed(item)
        else:
            h.update(repr(v).encode())
    feed(value)
    return h.hexdigest()[:16]


def run(sync: str, np_: int, scheme: str, extra: list[str], folder: str, name: str) -> dict:
    flags = ["--config", os.path.join(commands.ROOT, "configs", "tiny.yaml"), "--sync", sync, "--log-dir", folder,
             "--run-name", name, "--no-tensorboard", "--compression-warmup-steps", "2", *SCHEMES[scheme], *extra]
    if scheme == "none" and not extra and sync != "mpi-async-ps":
        flags = [f for f in flags if f not in ("--compression-warmup-steps", "2")]
    launcher = "single" if np_ == 1 else "horovodrun" if sync == "horovod" else "mpirun"
    jobs.run(name, [*commands.argv(launcher, np_), *flags], log=os.path.join(folder, f"{name}.log"), timeout=300)
    ckpt = torch.load(os.path.join(folder, name, CHECKPOINT), map_location="cpu", weights_only=False)
    return {"model": digest(ckpt["model"]), "optimizer": digest(ckpt["optimizer"]["state"]),
            "rank_states": digest(ckpt.get("rank_states") or [])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--compare", help="an earlier --out: report each case as same or different")
    p.add_argument("--only", nargs="+", metavar="TEXT",
                   help="run (and compare) only the cases whose name holds one of these, e.g. 'ddp np2' localsgd")
    args = p.parse_args(argv)
    found: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        for i, (sync, np_, scheme, extra) in enumerate(CASES):
            key = f"{sync} np{np_} {scheme}{' ' + ' '.join(extra) if extra else ''}"
            key += " (again)" if key in found else ""
            if args.only and not any(text in key for text in args.only):
                continue
            found[key] = run(sync, np_, scheme, extra, folder, f"case{i}")
            print(f"{key}: {found[key]}", flush=True)
    with open(args.out, "w") as f:
        json.dump(found, f, indent=1)
    if not args.compare:
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    differ = 0
    for key, now in found.items():
        same = before.get(key) == now
        differ += not same and "async" not in key
        print(f"{'same' if same else 'DIFFERENT'}: {key}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
