"""Data pipeline throughput: hvd_cifar's in-memory tensor loader vs a torchvision DataLoader
with per-sample PIL transforms, same images, same augmentation, same batch, one process.

    .venv/bin/python benchmarks/data_pipeline.py [--images 10000] [--batch-size 128] [--workers 2] [--threads 1]
        [--repeats 3] [--tag TAG] [--results benchmarks/results]

--repeats rounds of both pipelines, the first in each round alternating. Writes the results file
benchmarks/results/data_pipeline.json (hvd_cifar.measure.results: every round's images/s, medians and
spreads, and per round the ratio tensor loader / DataLoader; target >= 20x), then prints its table.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from hvd_cifar.workload import data
from testbed import jobs, render_docs
from hvd_cifar.measure.results import Figure, Results, add_options as add_results_options

FIGURES = {"images_per_s": Figure("images/s", ",.0f"), "ratio": Figure("tensor loader / DataLoader", ".1f")}
TENSOR, PIL = "hvd_cifar tensor loader", "torchvision DataLoader with PIL transforms"


class PILDataset(Dataset):
    """What a classic CIFAR pipeline does per sample: uint8 HWC array -> PIL -> transforms."""

    def __init__(self, images_hwc: np.ndarray, labels: np.ndarray, transform):
        self.images, self.labels, self.transform = images_hwc, labels, transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(Image.fromarray(self.images[i])), int(self.labels[i])


def images_per_s(batches, epochs: int) -> float:
    count, start = 0, time.perf_counter()
    for _ in range(epochs):
        for x, _ in batches():
            count += len(x)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the tensor loader (a training rank on a CPU host usually has 1)")
    jobs.add_options(parser, repeats=3)
    add_results_options(parser)
    args = parser.parse_args()
    # Batched ops on 32x32 images are too small to gain from threads; more threads than free
    # cores make OpenMP spin and can slow them down tenfold.
    torch.set_num_threads(args.threads)

    ds = data.load("synthetic", "", synthetic_size=args.images, seed=0)
    mean, std = ds.channel_stats()
    loader = data.ShardedLoader(ds.train_images, ds.train_labels, args.batch_size, 0, 1, 0, mean, std,
                                augment=True, hflip=True)
    transform = T.Compose([T.RandomCrop(32, padding=4, padding_mode="reflect"), T.RandomHorizontalFlip(),
                           T.ToTensor(), T.Normalize(mean.tolist(), std.tolist())])
    pil = PILDataset(ds.train_images.permute(0, 2, 3, 1).numpy(), ds.train_labels.numpy(), transform)
    dl = DataLoader(pil, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                    drop_last=True, persistent_workers=args.workers > 0)
    measure = {TENSOR: lambda: images_per_s(lambda: loader.epoch(0), args.epochs),
               PIL: lambda: images_per_s(lambda: dl, args.epochs)}
    results = Results("data_pipeline", args, FIGURES)
    for k in range(1, args.repeats + 1):
        for name in jobs.rotated(list(measure), k - 1):
            results.add(k, name, {"images_per_s": measure[name]()})
    results.derive("tensor loader / DataLoader", "ratio",
                   lambda r: r[TENSOR]["images_per_s"] / r[PIL]["images_per_s"])
    path = results.write()
    print(render_docs.render_block(os.path.basename(path), os.path.dirname(path)), end="")


if __name__ == "__main__":
    main()
