"""The compression schemes by name: what each one is, read by everything that must know one.
No torch here, and nothing of hvd_cifar beyond ``core`` (cost, wire, keys, errors), so that the
config (its keys, defaults and validation), the scaling model, predict, explain and the reports
can all loop over it.

Adding a scheme: its module ``hvd_cifar/compress/NAME.py`` (a ``Scheme`` subclass and
``create(settings, collective)``) and its entry in ``SCHEMES`` below. Its settings become config
keys and flags (named ``NAME_...``), validated by their rules, shown in ``--help``, saved with
the runs that use it and inert (with a warning) under another compression; ``plan`` gives the bytes and
collectives of one update to the scaling model, predict and explain; ``label`` its cell in tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hvd_cifar.core import cost, wire
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.core.keys import Setting, at_least


@dataclass(frozen=True)
class Spec:
    """One scheme: where its code is, its settings, what it sends, its name in a table."""
    module: str | None                  # the Scheme's module, imported when a run uses it; None: no scheme
    title: str                          # its name in prose ("a PowerSGD setting")
    meaning: str                        # one line: what goes on the wire
    settings: dict[str, Setting] = field(default_factory=dict)
    # Config keys beyond its own that ``create`` reads (the warm-up, the clipping threshold).
    reads: tuple[str, ...] = ()
    # (shapes, settings) -> one update's collectives [(kind, bytes, share)], kind allreduce or
    # allgather; None: the sync method's own allreduce of every gradient.
    plan: Callable[[list, dict], list] | None = None
    label: Callable[[dict], str] | None = None  # settings -> its cell in a table; None: the name
    # "fp16": the sync methods' own averaging does it natively (they keep their averaging);
    # None: the scheme replaces their averaging and gets every update.
    native: str | None = None
    # Bytes a gradient element takes on the wire when the sync method's own averaging does the
    # scheme natively (fp16: 2); None: the element's own size (fp32: 4).
    element_bytes: int | None = None
    check: Callable[[Any], None] | None = None    # rules that tie its keys to the others' (cfg)
    # What a scheme that replaces averaging can be combined with: amp: fp16's loss scaling
    # (error feedback would carry loss-scaled gradients across changes of the scale), and
    # freeze: auto, which measures averaged gradients.
    takes_grad_scaler: bool = True
    averages_gradients: bool = True


def _topk_rules(cfg) -> None:
    """top-k's techniques need the others they build on."""
    if cfg.topk_momentum_masking and not cfg.topk_momentum_correction:
        raise ConfigError("topk_momentum_masking: clears the velocity that topk_momentum_correction accumulates, "
                          "and that is off", fixes=(["--no-topk-momentum-masking"], ["--topk-momentum-correction"]))
    if cfg.topk_local_clip and not cfg.grad_clip:
        raise ConfigError("topk_local_clip: clips each rank's gradient at grad_clip x sqrt(ranks), and grad_clip is 0",
                          fixes=(["--grad-clip", "1.0"], ["--no-topk-local-clip"]))
    if cfg.topk_momentum_correction and cfg.freeze == "auto":
        raise ConfigError("freeze: auto measures averaged gradients, and with topk_momentum_correction the ranks "
                          "average velocities",
                          fixes=(["--no-topk-momentum-correction", "--no-topk-momentum-masking"], ["--freeze", "0"]))


SCHEMES: dict[str, Spec] = {
    "none": Spec(None, "uncompressed", "every gradient in fp32"),
    "fp16": Spec("hvd_cifar.compress.fp16", "fp16", "every gradient as fp16, averaged back into fp32", native="fp16",
                 element_bytes=wire.FP16_BYTES),
    "powersgd": Spec(
        "hvd_cifar.compress.powersgd", "PowerSGD", "low-rank factors P and Q of each matrix-shaped gradient, with error feedback",
        settings={
            "powersgd_rank": Setting(int, cost.POWERSGD_RANK, "columns of P and Q per matrix-shaped gradient",
                                     at_least(1), "must be >= 1", bytes=True),
            "powersgd_min_compression_rate": Setting(
                float, cost.MIN_COMPRESSION_RATE,
                "a matrix whose rows*cols / (rank*(rows+cols)) is not above this is sent whole", at_least(1),
                "must be >= 1 (below 1 a matrix would be sent as factors larger than itself)"),
            "powersgd_error_feedback": Setting(
                bool, True, "what the approximation left out is added to the next update's gradient"),
            "powersgd_warm_start": Setting(
                bool, True, "each update's power step starts from the last update's Q (false: a new random Q)"),
        },
        reads=("compression_warmup_steps",),
        plan=lambda shapes, s: cost.powersgd_plan(shapes, s["powersgd_rank"], s["powersgd_min_compression_rate"]),
        label=lambda s: f"powersgd r={s['powersgd_rank']}", takes_grad_scaler=False),
    "topk": Spec(
        "hvd_cifar.compress.topk", "top-k", "the largest entries of each gradient, values and indices gathered, error feedback",
        settings={
            "topk_fraction": Setting(float, cost.TOPK_FRACTION,
                                     "share of each gradient's entries a rank sends after the warm-up, in (0, 1]",
                                     lambda f: 0 < f <= 1, "must be in (0, 1]", bytes=True),
            "topk_min_entries": Setting(int, cost.TOPK_MIN_ENTRIES,
                                        "a matrix of fewer entries is averaged whole, like the vectors",
                                        at_least(0), "must be >= 0", bytes=True),
            "topk_warmup_epochs": Setting(float, 4.0, "epochs over which the share sent falls from 0.25 to "
                                          "topk_fraction; 0 = none", at_least(0), "must be >= 0"),
            "topk_momentum_correction": Setting(
                bool, True, "accumulate the velocity, not the gradient; the optimizer steps without momentum"),
            "topk_momentum_masking": Setting(
                bool, True, "clear the velocity of the entries sent (needs topk_momentum_correction)"),
            "topk_local_clip": Setting(
                bool, True, "each rank clips its gradient at grad_clip x sqrt(ranks) before accumulating it"),
        },
        reads=("compression_warmup_steps", "grad_clip"),
        plan=lambda shapes, s: cost.topk_plan(shapes, s["topk_fraction"], s["topk_min_entries"]),
        label=lambda s: f"topk f={s['topk_fraction']:g}" + (
            f" min={s['topk_min_entries']}" if s["topk_min_entries"] != cost.TOPK_MIN_ENTRIES else ""),
        check=_topk_rules, takes_grad_scaler=False),
    "local-sgd": Spec(
        "hvd_cifar.compress.localsgd", "local SGD",
        "after the warm-up no gradients: the models' trainable parameters averaged every local_sgd_steps updates",
        settings={
            "local_sgd_steps": Setting(int, 4, "updates between two averages of the models, after compression_warmup_steps",
                                       at_least(2), "must be >= 2 (1 would average the models at every update)",
                                       bytes=True),
        },
        reads=("compression_warmup_steps",),
        plan=lambda shapes, s: cost.localsgd_plan(shapes, s["local_sgd_steps"]),
        label=lambda s: f"local SGD H={s['local_sgd_steps']}", averages_gradients=False),
}


def names() -> tuple[str, ...]:
    """Every value of the config key ``compression``."""
    return tuple(SCHEMES)


def replacing() -> tuple[str, ...]:
    """The schemes that replace a sync method's gradient averaging (not none, not fp16)."""
    return tuple(name for name, spec in SCHEMES.items() if spec.module and spec.native is None)


def settings() -> dict[str, tuple[str, Setting]]:
    """Every scheme's config keys: {key: (scheme, setting)}, in the registry's order."""
    return {key: (name, s) for name, spec in SCHEMES.items() for key, s in spec.settings.items()}


def defaults(name: str) -> dict[str, Any]:
    return {key: s.default for key, s in SCHEMES[name].settings.items()}


def of(name: str, values: Any) -> dict[str, Any]:
    """Scheme ``name``'s settings from ``values`` (a Config, or a run's saved config as a dict):
    each key there, else its default."""
    get = values.get if isinstance(values, dict) else lambda key: getattr(values, key, None)
    return {key: s.default if get(key) is None else s.kind(get(key)) for key, s in SCHEMES[name].settings.items()}


def check(cfg) -> None:
    """The chosen scheme's rules that tie its keys to the others."""
    spec = SCHEMES[cfg.compression]
    if spec.check:
        spec.check(cfg)


def inert(cfg, key: str) -> str | None:
    """Why scheme setting ``key`` does nothing under ``cfg`` (another compression), or None."""
    name = settings()[key][0]
    return None if cfg.compression == name else f"a {SCHEMES[name].title} setting, and compression is {cfg.compression}"


def replaces_averaging(compression: str) -> bool:
    """Whether compression ``compression`` hands gradient averaging to a scheme (powersgd, topk,
    local SGD), which needs a sync method that runs schemes."""
    return compression in replacing()


def plan(name: str, shapes: list, values: dict | None = None) -> list | None:
    """One update's collectives, as (kind, bytes, share in the updates), under scheme ``name``
    with ``values`` (its settings; the defaults for the rest); None: the sync method's own
    allreduce of every gradient."""
    spec = SCHEMES[name]
    return spec.plan(shapes, {**defaults(name), **(values or {})}) if spec.plan else None


def label(name: str, values: dict | None = None) -> str:
    """The scheme and its byte-shaping settings as a table's cell: none, fp16, powersgd r=4,
    topk f=0.004, local SGD H=4."""
    spec = SCHEMES[name]
    return spec.label({**defaults(name), **(values or {})}) if spec.label else name
