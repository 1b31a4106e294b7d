"""``dataset: shapes``: a CIFAR-shaped data set made here, deterministically from a seed, for work
that digits' 360 test images cannot resolve and real CIFAR-10 cannot be downloaded for.

3x32x32 uint8 colour images in 10 classes, 50,000 training and 10,000 test images by default
(``shapes_train``, ``shapes_test``). Each image is one object or textured patch (the class) drawn
at a random position, scale (0.3-0.7 of the half-width), rotation and colour, on a background of
a random colour with a brightness ramp, up to 6 clutter ellipses of other colours, in 60 % of the
images an occluding rectangle in front of it, and Gaussian pixel noise (sigma 6-28). The classes:

    0 disk      1 ring      2 square     3 triangle    4 cross
    5 star      6 crescent  7 stripes    8 checker     9 dots

7-9 are textures inside a random ellipse, so their outline says nothing: what is inside does.
Nothing about a class sits at a fixed place or colour, so a linear model on the pixels stays far
below a CNN (docs/DATA.md gives the measured difficulty).

Labels are balanced (each class a tenth of each split), then shuffled. The test split is drawn
from its own stream of the seed, so it is the same whatever the training size. ``write`` stores
both splits in CIFAR-10's own python format (data_batch_1..5, test_batch, batches.meta under
cifar-10-batches-py), which the trainer reads through the same code as real CIFAR-10
(``workload.cifar_format``).
"""
from __future__ import annotations

import numpy as np

CLASSES = ("disk", "ring", "square", "triangle", "cross", "star", "crescent", "stripes", "checker", "dots")
SIZE = 32
CHUNK = 2000  # images drawn at once (memory: about 10 float32 arrays of CHUNK x 32 x 32)

_axis = (np.arange(SIZE, dtype=np.float32) + 0.5) / SIZE * 2 - 1  # pixel centres in [-1, 1]
_Y, _X = np.meshgrid(_axis, _axis, indexing="ij")


def generate(n: int, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images (n, 3, 32, 32) uint8 and their labels (n,) int64 of one split ("train" or
    "test"), the same for the same (n, seed, split)."""
    stream = {"train": 0, "test": 1}[split]
    rng = np.random.default_rng(np.random.SeedSequence([seed, stream]))
    labels = np.arange(n, dtype=np.int64) % len(CLASSES)
    rng.shuffle(labels)
    images = np.empty((n, 3, SIZE, SIZE), dtype=np.uint8)
    for start in range(0, n, CHUNK):
        chunk = labels[start:start + CHUNK]
        images[start:start + len(chunk)] = _draw(chunk, rng)
    return images, labels


def _uniform(rng, low, high, n):
    return rng.uniform(low, high, n).astype(np.float32)[:, None, None]


def _draw(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = len(labels)
    canvas = _background(n, rng)
    for _ in range(6):  # clutter: up to 6 ellipses of their own colours, behind the object
        present = rng.random(n) < 0.7
        _paint(canvas, _ellipse(n, rng, 0.08, 0.4) & present[:, None, None], _colours(n, rng))
    # The object: class shape in coordinates moved, scaled and rotated per image.
    tx, ty = _uniform(rng, -0.45, 0.45, n), _uniform(rng, -0.45, 0.45, n)
    scale, angle = _uniform(rng, 0.3, 0.7, n), _uniform(rng, 0, 2 * np.pi, n)
    u = (np.cos(angle) * (_X - tx) + np.sin(angle) * (_Y - ty)) / scale
    v = (-np.sin(angle) * (_X - tx) + np.cos(angle) * (_Y - ty)) / scale
    colour, second = _colours(n, rng), _colours(n, rng)
    frequency = _uniform(rng, 2.5, 4.0, n)
    for k in range(len(CLASSES)):
        rows = np.flatnonzero(labels == k)
        if len(rows):
            mask, pattern = _shape(k, u[rows], v[rows], frequency[rows], rng)
            _paint(canvas, mask, colour, rows=rows)
            if pattern is not None:
                _paint(canvas, mask & pattern, second, rows=rows)
    # An occluding rectangle in front, in 60 % of the images.
    present = rng.random(n) < 0.6
    x0, y0 = _uniform(rng, -1, 0.6, n), _uniform(rng, -1, 0.6, n)
    w, h = _uniform(rng, 0.2, 0.6, n), _uniform(rng, 0.2, 0.6, n)
    box = (_X >= x0) & (_X < x0 + w) & (_Y >= y0) & (_Y < y0 + h) & present[:, None, None]
    _paint(canvas, box, _colours(n, rng))
    canvas += rng.normal(0, 1, canvas.shape).astype(np.float32) * _uniform(rng, 6, 28, n)[:, None]
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8)


def _background(n: int, rng: np.random.Generator) -> np.ndarray:
    base = _colours(n, rng)
    ramp_angle = rng.uniform(0, 2 * np.pi, n).astype(np.float32)[:, None, None]
    ramp = (np.cos(ramp_angle) * _X + np.sin(ramp_angle) * _Y) * _uniform(rng, 0, 40, n)
    return base[:, :, None, None] + ramp[:, None]


def _colours(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 255, (n, 3)).astype(np.float32)


def _paint(canvas: np.ndarray, mask: np.ndarray, colour: np.ndarray, rows: np.ndarray | None = None) -> None:
    """Where ``mask`` (images x 32 x 32) holds, the pixels of those images become ``colour``."""
    rows = np.arange(len(canvas)) if rows is None else rows
    target = canvas[rows]
    np.copyto(target, colour[rows][:, :, None, None], where=mask[:, None])
    canvas[rows] = target


def _ellipse(n: int, rng: np.random.Generator, low: float, high: float) -> np.ndarray:
    cx, cy = _uniform(rng, -1, 1, n), _uniform(rng, -1, 1, n)
    a, b, t = _uniform(rng, low, high, n), _uniform(rng, low, high, n), _uniform(rng, 0, np.pi, n)
    du, dv = _X - cx, _Y - cy
    p, q = np.cos(t) * du + np.sin(t) * dv, -np.sin(t) * du + np.cos(t) * dv
    return (p / a) ** 2 + (q / b) ** 2 < 1


def _shape(k: int, u: np.ndarray, v: np.ndarray, frequency: np.ndarray, rng: np.random.Generator):
    """Class ``k``'s mask in its own coordinates, and for the textures the pattern inside it."""
    rho, phi = np.hypot(u, v), np.arctan2(v, u)
    if k == 0:
        return rho < 1, None
    if k == 1:
        return (rho < 1) & (rho > 0.6), None
    if k == 2:
        return np.maximum(np.abs(u), np.abs(v)) < 0.8, None
    if k == 3:  # equilateral, centred
        return (v > -0.5) & (np.sqrt(3) * u + v < 1) & (-np.sqrt(3) * u + v < 1), None
    if k == 4:
        return ((np.abs(u) < 0.28) & (np.abs(v) < 1)) | ((np.abs(v) < 0.28) & (np.abs(u) < 1)), None
    if k == 5:
        return rho < 0.55 + 0.45 * np.cos(5 * phi), None
    if k == 6:
        return (rho < 1) & (np.hypot(u - 0.45, v) > 0.75), None
    aspect = rng.uniform(0.7, 1.0, len(u)).astype(np.float32)[:, None, None]
    patch = (u / 1.1) ** 2 + (v / (1.1 * aspect)) ** 2 < 1
    f = frequency * np.pi
    if k == 7:
        return patch, np.sin(f * u) > 0
    if k == 8:
        return patch, np.sin(f * u) * np.sin(f * v) > 0
    return patch, (np.cos(f * u) + np.cos(f * v)) > 1.0  # 9: dots
