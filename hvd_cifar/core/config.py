"""One typed, validated config for a training run.

Precedence: the defaults below < a YAML file (``--config FILE``) < command-line flags.
Flags are kebab-case spellings of the YAML's snake_case keys::

    python -m hvd_cifar.train --config configs/demo.yaml --batch-size 64 --no-nesterov
    python -m hvd_cifar.train --fp16-allreduce true --freeze-schedule "{0: 0, 10: 2}"

Every mistake (unknown key, wrong type, out-of-range value) raises ``ConfigError`` with one
line that names the key; the entry point turns it into one message and a non-zero exit.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.util
import math
import os
import socket
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

from hvd_cifar.compress import registry
from hvd_cifar.core import combinations
from hvd_cifar.core.errors import ConfigError  # noqa: F401 (config.ConfigError: the name its callers know)
from hvd_cifar.core.files import atomic_write
from hvd_cifar.core.names import COMPRESSIONS, SYNC_METHODS

DATASETS = ("digits", "shapes", "cifar10", "cifar100", "svhn", "synthetic")
# Each model's measured default lr (per rank at the default batch_size 32; `lr: 0` takes it).
# VGG-11's and ResNet-18's: with it, every key else at its default, the model reaches 95 % on
# digits in 6 epochs at 1, 2 and 4 ranks, with 4 accumulation steps and with fp16. The small
# CNN's was chosen on the generated data set's tuning seeds, where 0.1 beat 0.05 at 1, 2 and 4
# ranks (benchmarks/results/convergence-smallcnn-shapes-lr-tuning.json); on digits it meets 95 %
# at 1 and 2 ranks and with fp16, and with 4 accumulation steps it does not
# (docs/CONVERGENCE.md). The deeper VGGs are unmeasured and take VGG-11's.
MODEL_LR = {"vgg11": 0.02, "vgg13": 0.02, "vgg16": 0.02, "vgg19": 0.02, "resnet18": 0.02, "smallcnn": 0.1}
MODELS = tuple(MODEL_LR)
SCHEDULES = ("onecycle", "cosine", "step")
LR_SCALINGS = ("linear", "sqrt", "none")
AMP_MODES = ("none", "fp16", "bf16")
# compute: a setting names a precision (fp32: no autocast) and a layout (NCHW, or -channels-last).
COMPUTE_SETTINGS = {f"{precision}{layout}": ("none" if precision == "fp32" else precision, bool(layout))
                    for precision in ("fp32", "bf16", "fp16") for layout in ("", "-channels-last")}
COMPUTE_CHOICES = ("auto", "fixed", *COMPUTE_SETTINGS)


@dataclass
class Config:
    # --- data ---
    dataset: str = "digits"            # the data set: digits ships with scikit-learn, the others come from torchvision
    data_dir: str = "data"             # where torchvision data sets live / are downloaded to
    download: bool = False             # allow torchvision to download (needs internet)
    augment: bool = True               # pad-4 random crop (+ flip where the data set allows)
    synthetic_size: int = 2048         # images in the synthetic training set (test set: 1/4)
    shapes_train: int = 50_000         # shapes: training images generated (docs/DATA.md)
    shapes_test: int = 10_000          # shapes: test images generated (the same set whatever shapes_train is)
    shapes_seed: int = 0               # shapes: the seed the data set is generated from (apart from the run's seed)
    # --- model ---
    model: str = "vgg11"               # the network (hvd_cifar/workload/models.py)
    batchnorm: bool = True             # BatchNorm after each conv (false: exact accumulation checks; not resnet18)
    channels_last: bool = False        # NHWC memory layout of the input batches; with compute: auto, true pins it
    amp: str = "none"                  # autocast: none | fp16 (with a grad scaler) | bf16; with compute: auto, fp16 or bf16 pins it
    compute: str = "auto"              # auto: time each precision and layout this device runs well on a few steps, take the fastest; fixed: amp and channels_last as given; or one setting (fp32, bf16-channels-last, ...)
    # --- optimisation ---
    epochs: int = 10                   # passes over the training set; the schedule spans them all
    # Defaults measured to train every model at 1, 2 and 4 ranks and with 4 accumulation steps
    # (docs/CONVERGENCE.md): 32 images per rank, the model's lr, linear scaling, clipped gradients.
    batch_size: int = 32               # images per rank per forward/backward pass
    lr: float = 0.0                    # for one rank at batch_size, scaled per lr_scaling; 0 = MODEL_LR[model]
    lr_scaling: str = "linear"         # how lr grows with images per update: linear | sqrt | none
    warmup_epochs: float = 1.0         # epochs one rank takes to reach lr; the scaled peak takes longer (LrSchedule)
    schedule: str = "onecycle"         # after warm-up: onecycle (linear to 0) | cosine | step (x0.1 at 50%, 75%)
    momentum: float = 0.9              # SGD momentum
    nesterov: bool = True              # Nesterov momentum (needs momentum > 0)
    weight_decay: float = 5e-4         # L2 penalty; none on biases and BatchNorm
    label_smoothing: float = 0.0       # cross-entropy label smoothing, in [0, 1)
    grad_clip: float = 1.0             # max global norm of the averaged gradients; 0 = no clipping
    target_acc: float = 0.0            # test accuracy whose first epoch and time go into eval.json; 0 = none
    # --- distribution ---
    sync: str = "horovod"              # how the ranks share gradients (docs/SYNC_METHODS.md)
    fp16_allreduce: bool = False       # gradients cross the wire as fp16: the same as compression: fp16
    # Communication reduction (hvd_cifar/compress/, docs/COMM_OPTIONS.md); powersgd, topk and local SGD: horovod, ddp
    compression: str = "none"          # gradients on the wire: one of hvd_cifar/compress/registry.py's schemes (none | fp16 | powersgd | topk); each scheme's own keys are in its group below
    compression_warmup_steps: int = 20  # powersgd, topk, local SGD: first updates average the gradients whole (PowerSGD's start iteration, post-local SGD's switch-over)
    local_sgd_steps: int = 1           # > 1: after compression_warmup_steps updates, no gradient averaging; the models are averaged every this many updates
    accumulation_steps: int = 1        # local forward/backward passes per synchronisation
    freeze: int | str = 0              # leading feature blocks that do not train, or auto (hvd_cifar/trainer/freezing.py)
    freeze_auto_threshold: float = 0.02  # freeze: auto: a block freezes once its mean gradient norm changes by less than this from one epoch to the next (relative)
    freeze_schedule: dict = field(default_factory=dict)  # {epoch: frozen blocks from that epoch on}
    elastic: bool = False              # Horovod elastic training (horovodrun --min-np/--max-np/--host-discovery-script)
    commit_every: int = 10             # elastic: optimizer updates between commits of the state (work lost at most)
    liveness_timeout_s: float = 30.0   # seconds a rank's heartbeat to rank 0 (or rank 0's to it) may go unheard before its host counts as dropped off the network and the job ends; 0 = off
    ps_servers: int = 1                # sync: mpi-async-ps: the first this many ranks hold the weights, the rest train
    # Horovod's own tuning (sync: horovod); null = the launcher's setting (horovodrun --cycle-time-ms,
    # --fusion-threshold-mb, --hierarchical-allreduce, --autotune), else hvd_cifar's or Horovod's default
    horovod_cycle_time_ms: float | None = None       # negotiation cycle; unset anywhere: 5 ms (hvd_cifar's)
    horovod_fusion_threshold_mb: float | None = None  # MiB of gradients fused into one allreduce; 0 = no fusion
    horovod_hierarchical: bool | None = None          # hierarchical allreduce (several ranks per host)
    horovod_autotune: bool | None = None              # Horovod's autotuner; its log: RUN/autotune.csv
    comm_timeline: bool = False        # record when communication ran (horovod: its timeline, RUN/timeline.json; ddp: a comm hook): comm_hidden_s / comm_exposed_s per epoch
    nic: str = "auto"                  # interface whose byte counters are recorded per host; auto = busiest non-loopback; a named one must exist
    # --- run control ---
    seed: int = 0                      # the initial weights, the shuffling and the augmentation
    threads_per_rank: int = 0          # torch intra-op threads; 0 = cores on the host / ranks on the host; at most the usable CPUs
    max_steps_per_epoch: int = 0       # 0 = the full epoch; >0 cuts epochs short (quick runs, benchmarks)
    eval_batch_size: int = 500         # images per rank per evaluation batch
    log_dir: str = "logs"              # run folders are created under here
    run_name: str = ""                 # "" = timestamped unique name
    checkpoint_every: int = 1          # epochs between checkpoints; 0 = only at the end
    stop_after: int = 0                # end the run after this many epochs (0 = all); the schedule still spans `epochs`
    resume: str = ""                   # run folder (or run name under log_dir) to continue
    progress: bool = True              # tqdm bar on rank 0
    tensorboard: bool = True           # rank 0 also writes each metrics line into TensorBoard event files in the run folder

    # ------------------------------------------------------------------
    def validate(self) -> "Config":
        for key, allowed in CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(f"{key}: {getattr(self, key)!r} is not one of {', '.join(allowed)}")
        positive = ("epochs", "batch_size", "accumulation_steps", "eval_batch_size", "synthetic_size", "shapes_train",
                    "shapes_test",
                    "commit_every", "ps_servers", "local_sgd_steps")
        for key in positive:
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: must be >= 1, got {getattr(self, key)}")
        non_negative = ("warmup_epochs", "momentum", "weight_decay", "grad_clip", "seed", "shapes_seed",
                        "threads_per_rank", "max_steps_per_epoch", "checkpoint_every", "stop_after",
                        "compression_warmup_steps")
        for key in non_negative:
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: must be >= 0, got {getattr(self, key)}")
        if not (self.liveness_timeout_s == 0 or self.liveness_timeout_s >= 1):
            raise ConfigError(f"liveness_timeout_s: must be 0 (off) or >= 1 (seconds), got {self.liveness_timeout_s}")
        if self.lr < 0:
            raise ConfigError(f"lr: must be > 0, got {self.lr} (or 0 for the model's default)")
        if self.lr == 0:
            self.lr = MODEL_LR[self.model]  # resolved here, so config.yaml holds the rate used
        if not 0 <= self.target_acc <= 1:
            raise ConfigError(f"target_acc: must be in [0, 1] (a fraction, e.g. 0.95), got {self.target_acc}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing: must be in [0, 1), got {self.label_smoothing}")
        if self.momentum >= 1:
            raise ConfigError(f"momentum: must be < 1, got {self.momentum}")
        if self.nesterov and self.momentum == 0:
            raise ConfigError("nesterov: needs momentum > 0")
        if self.warmup_epochs > self.epochs:
            raise ConfigError(f"warmup_epochs: {self.warmup_epochs} is longer than epochs ({self.epochs})")
        for epoch, frozen in self.freeze_schedule.items():
            if not isinstance(epoch, int) or not isinstance(frozen, int) or epoch < 0 or frozen < 0:
                raise ConfigError(f"freeze_schedule: entries must be 'epoch: blocks' with "
                                  f"non-negative integers, got {epoch!r}: {frozen!r} (write it as "
                                  f"'{{0: 0, 10: 2}}', with a space after each colon)")
        combinations.validate_compute(self, COMPUTE_SETTINGS)
        combinations.validate_freeze(self)
        if self.elastic and self.sync != "horovod":
            raise ConfigError(f"elastic: needs sync: horovod (Horovod's elastic driver), got sync: {self.sync}")
        combinations.validate_horovod_tuning(self)
        combinations.validate_compression(self)
        if not self.batchnorm and self.model == "resnet18":
            raise ConfigError("batchnorm: resnet18 is only built with BatchNorm")
        if self.run_name and (os.sep in self.run_name or self.run_name in (".", "..")):
            raise ConfigError(f"run_name: must be a plain folder name, got {self.run_name!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str) -> None:
        """Write config.yaml whole or not at all (temp file + rename)."""
        atomic_write(path, lambda f: f.write(yaml.safe_dump(self.to_dict(), sort_keys=False).encode()))


# Each compression scheme's own keys (hvd_cifar/compress/registry.py) come after the keys above,
# in the Config every part of hvd_cifar uses; CoreConfig is the class written here, whose source
# (the comments beside the fields) the --help reads.
CoreConfig = Config
Config = dataclasses.make_dataclass(  # type: ignore[misc]
    "Config", [(key, s.kind, field(default=s.default)) for key, (_, s) in registry.settings().items()],
    bases=(CoreConfig,))
Config.__module__, Config.__doc__ = __name__, "The run's config: the keys above, then each compression scheme's own."
FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def settings_for(kind: type, cfg: Config):
    """The typed settings a part of the trainer reads (``kind``, a dataclass whose fields are
    config keys), taken from ``cfg``: what that part is given instead of the whole Config."""
    return kind(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(kind)})
CHOICES = {"dataset": DATASETS, "model": MODELS, "sync": SYNC_METHODS, "schedule": SCHEDULES, "amp": AMP_MODES,
           "lr_scaling": LR_SCALINGS, "compression": COMPRESSIONS, "compute": COMPUTE_CHOICES}  # the keys that take one of a list
_HINTS = typing.get_type_hints(Config)
# The keys of Horovod's own tuning (null = the launcher's setting; hvd_cifar.sync.horovod applies them).
HOROVOD_TUNING = tuple(key for key in FIELDS if key.startswith("horovod_"))


def _optional(key: str) -> type | None:
    """``X`` for a key typed ``X | None`` (null: someone else's setting), else None."""
    kinds = typing.get_args(_HINTS[key])
    return next((k for k in kinds if k is not type(None)), None) if type(None) in kinds else None


def _is_bool(key: str) -> bool:
    return bool in (_HINTS[key], _optional(key))


def _unknown(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, FIELDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{key}: unknown config key{hint}")


def _coerce(key: str, value: Any, from_cli: bool) -> Any:
    """Check ``value`` against the field's type; CLI strings are parsed as YAML scalars first."""
    kind = _optional(key) or _HINTS[key]
    if isinstance(kind, types.GenericAlias):
        kind = typing.get_origin(kind)
    raw = value
    if from_cli and isinstance(value, str) and kind is not str:
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"{key}: cannot parse {value!r}") from None
    if value is None and _optional(key):
        return None
    if kind is dict and value is not None and not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping such as '{{0: 0, 10: 2}}' (a space after each "
                          f"colon), got {raw!r}")
    if kind is str and from_cli:
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is float and isinstance(value, str):
        # YAML 1.1 reads 1e30 (no dot, no sign in the exponent) as a string; it is a number.
        with contextlib.suppress(ValueError):
            value = float(value)
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {raw!r}")
    if kind is dict and value is None:
        value = {}
    kinds = typing.get_args(kind) or (kind,)  # freeze: int | str
    if not isinstance(value, kinds) or (int in kinds and isinstance(value, bool)):
        raise ConfigError(f"{key}: expected {' or '.join(k.__name__ for k in kinds)}, got {value!r} "
                          f"({type(value).__name__})")
    return value


def apply(cfg: Config, updates: dict[str, Any], from_cli: bool = False) -> Config:
    for key, value in updates.items():
        if key not in FIELDS:
            raise _unknown(key)
        setattr(cfg, key, _coerce(key, value, from_cli))
    return cfg


def load_yaml(path: str) -> dict[str, Any]:
    try:
        # UTF-8 whatever the locale says: YAML files are UTF-8, and a config must read the same
        # on every host.
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config: file {path} does not exist") from None
    except OSError as exc:  # a folder, no permission, an I/O error
        raise ConfigError(f"config: cannot read {path} ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config: {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}); a config is a YAML file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config: {path} is not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping of keys to values")
    return data


def parse_flags(argv: list[str]) -> tuple[str | None, dict[str, Any]]:
    """``--key value``, ``--key=value``, ``--flag`` / ``--no-flag`` → (config file, {key: raw})."""
    config_file, updates = None, {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"command line: unexpected argument {arg!r} (flags look like --batch-size 64)")
        name, eq, inline = arg[2:].partition("=")
        key = name.replace("-", "_")
        negated = key.startswith("no_") and key[3:] in FIELDS and _is_bool(key[3:])
        if key == "config":
            value, i = (inline, i + 1) if eq else (_next(argv, i, key), i + 2)
            config_file = value
            continue
        if negated:
            if eq:
                raise ConfigError(f"{key[3:]}: --{name} takes no value")
            updates[key[3:]] = False
            i += 1
            continue
        if key not in FIELDS:
            raise _unknown(key)
        if eq:
            updates[key] = inline
            i += 1
        elif _is_bool(key) and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            updates[key] = True
            i += 1
        else:
            updates[key] = _next(argv, i, key)
            i += 2
    return config_file, updates


def _next(argv: list[str], i: int, key: str) -> str:
    if i + 1 >= len(argv):
        raise ConfigError(f"{key}: --{key.replace('_', '-')} needs a value")
    return argv[i + 1]


def given_keys(argv: list[str]) -> set[str]:
    """The keys a command line sets, by flag or through its --config file (not the defaults,
    nor a resumed run's saved config)."""
    config_file, flag_updates = parse_flags(argv)
    return set(flag_updates) | (set(load_yaml(config_file)) if config_file else set())


def from_args(argv: list[str], base: dict[str, Any] | None = None) -> Config:
    """Defaults < ``base`` (a saved run's config, when resuming) < YAML file < flags."""
    config_file, flag_updates = parse_flags(argv)
    cfg = Config()
    if base:
        apply(cfg, base)
    if config_file:
        apply(cfg, load_yaml(config_file))
    apply(cfg, flag_updates, from_cli=True)
    return check_host(cfg.validate())


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a cgroup, taskset or an MPI binding may
    allow fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_host(cfg: Config) -> Config:
    """The values that must fit the host this process runs on, checked on every rank before
    anything starts. threads_per_rank above the usable CPUs is an error, not a clamp: more
    threads than CPUs only adds contention (100000 exhausted memory creating them, and failed
    somewhere unrelated), a clamp would run something other than the config.yaml the run
    saves, and a different thread count can change CPU results in the last bits (the order of
    reductions), which exact resumes and comparisons rely on. 0 already means 'fit the host'."""
    cpus = usable_cpus()
    if cfg.threads_per_rank > cpus:
        raise ConfigError(f"threads_per_rank: {cfg.threads_per_rank} is more than the {cpus} CPUs this process "
                          f"may use on {socket.gethostname()} (0: this host's CPUs shared among its ranks)",
                          fixes=(["--threads-per-rank", str(cpus)], ["--threads-per-rank", "0"]))
    if cfg.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("tensorboard: the tensorboard package is not installed here (scripts/install.sh "
                          "installs it)", fixes=(["--no-tensorboard"],))
    return cfg
