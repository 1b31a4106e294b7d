"""One typed, validated, frozen config for a training run.

Precedence: the defaults below < a resumed run's saved config < a YAML file (``--config FILE``)
< command-line flags. Flags are kebab-case spellings of the YAML's snake_case keys::

    python -m hvd_cifar.train --config configs/demo.yaml --batch-size 64 --no-nesterov
    python -m hvd_cifar.train --compression fp16 --freeze-schedule "{0: 0, 10: 2}"

``Config`` is the keys declared here (each with its meaning and rule in the field's metadata)
plus every sync method's and every compression scheme's own keys, as their registries declare
them (core.methods, core.schemes). Every mistake (unknown key, wrong type, out-of-range value, a
combination the run cannot honour) raises ``ConfigError`` with one line that names the key; the
entry point turns it into one message and a non-zero exit. Nothing changes a Config: the few
values settled at run time (``Config.settle``) make a copy that remembers what was given, which
is what config.yaml holds, and resolved.yaml what the run used instead.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import socket
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import yaml

from hvd_cifar.core import aliases, combinations, flags, methods, schemes
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.core.files import atomic_write
from hvd_cifar.core.keys import at_least
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
GROUPS = ("data", "model", "optimisation", "distribution", "run control")

Rule = Callable[[Any], str]  # a value -> what is wrong with it, as the error says it after "key: " ('' if nothing)


def rule(allowed: Callable[[Any], bool], text: str, note: str = "") -> Rule:
    return lambda value: "" if allowed(value) else f"{text}, got {value!r}" + (f" ({note})" if note else "")


AT_LEAST_1, NON_NEGATIVE = rule(at_least(1), "must be >= 1"), rule(at_least(0), "must be >= 0")
FRACTION = rule(lambda v: 0 <= v <= 1, "must be in [0, 1] (a fraction, e.g. 0.95)")


def _freeze_rule(freeze: int | str) -> str:
    if isinstance(freeze, str):
        return "" if freeze == "auto" else f"expected a number of leading blocks or auto, got {freeze!r}"
    return NON_NEGATIVE(freeze)


def _freeze_schedule_rule(schedule: dict) -> str:
    bad = next(((e, b) for e, b in schedule.items()
                if not isinstance(e, int) or not isinstance(b, int) or e < 0 or b < 0), None)
    return "" if bad is None else (f"entries must be 'epoch: blocks' with non-negative integers, got {bad[0]!r}: "
                                   f"{bad[1]!r} (write it as '{{0: 0, 10: 2}}', with a space after each colon)")


def _group(name: str):
    """The maker of group ``name``'s keys: ``key(default, meaning, rule, choices)`` is a field
    whose metadata the flags, ``--help``, docs/CONFIG.md's tables and the validation read."""
    def key(default: Any, meaning: str, check: Rule | None = None, choices: tuple[str, ...] = ()) -> Any:
        metadata = {"group": name, "meaning": meaning, "rule": check, "choices": choices}
        if isinstance(default, dict):
            return field(default_factory=dict, metadata=metadata)
        return field(default=default, metadata=metadata)
    return key


data_key, model_key, optimisation_key, distribution_key, run_key = map(_group, GROUPS)


@dataclass(frozen=True)
class CoreKeys:
    """The keys every run has; ``Config`` adds the registries' keys to them."""
    dataset: str = data_key(
        "digits", "the data set: digits ships with scikit-learn; shapes and synthetic are generated here; "
        "cifar10, cifar100 and svhn come from torchvision", choices=DATASETS)
    data_dir: str = data_key("data", "where torchvision data sets live / are downloaded to")
    download: bool = data_key(False, "allow torchvision to download (needs internet)")
    augment: bool = data_key(True, "pad-4 random crop (+ flip where the data set allows)")
    synthetic_size: int = data_key(2048, "images in the synthetic training set (test set: 1/4)", AT_LEAST_1)
    shapes_train: int = data_key(50_000, "shapes: training images generated (docs/DATA.md)", AT_LEAST_1)
    shapes_test: int = data_key(
        10_000, "shapes: test images generated (the same set whatever shapes_train is)", AT_LEAST_1)
    shapes_seed: int = data_key(
        0, "shapes: the seed the data set is generated from (apart from the run's seed)", NON_NEGATIVE)
    model: str = model_key("vgg11", "the network (hvd_cifar/workload/models.py)", choices=MODELS)
    batchnorm: bool = model_key(True, "BatchNorm after each conv (false: exact accumulation checks; not resnet18)")
    channels_last: bool = model_key(False, "NHWC memory layout of the input batches; with compute: auto, true pins it")
    amp: str = model_key(
        "none", "autocast: none | fp16 (with a grad scaler) | bf16; with compute: auto, fp16 or bf16 pins it",
        choices=AMP_MODES)
    compute: str = model_key(
        "auto", "auto: time each precision and layout this device runs well on a few steps, take the fastest; "
        "fixed: amp and channels_last as given; or one setting (fp32, bf16-channels-last, ...)",
        choices=COMPUTE_CHOICES)
    # Defaults measured to train every model at 1, 2 and 4 ranks and with 4 accumulation steps
    # (docs/CONVERGENCE.md): 32 images per rank, the model's lr, linear scaling, clipped gradients.
    epochs: int = optimisation_key(10, "passes over the training set; the schedule spans them all", AT_LEAST_1)
    batch_size: int = optimisation_key(32, "images per rank per forward/backward pass", AT_LEAST_1)
    lr: float = optimisation_key(
        0.0, "for one rank at batch_size, scaled per lr_scaling; 0 = the model's default",
        rule(at_least(0), "must be > 0", "or 0 for the model's default"))
    lr_scaling: str = optimisation_key(
        "linear", "how lr grows with images per update: linear | sqrt | none", choices=LR_SCALINGS)
    warmup_epochs: float = optimisation_key(
        1.0, "epochs one rank takes to reach lr; the scaled peak takes longer (LrSchedule)", NON_NEGATIVE)
    schedule: str = optimisation_key(
        "onecycle", "after warm-up: onecycle (linear to 0) | cosine | step (x0.1 at 50%, 75%)", choices=SCHEDULES)
    momentum: float = optimisation_key(0.9, "SGD momentum", rule(lambda v: 0 <= v < 1, "must be in [0, 1)"))
    nesterov: bool = optimisation_key(True, "Nesterov momentum (needs momentum > 0)")
    weight_decay: float = optimisation_key(5e-4, "L2 penalty; none on biases and BatchNorm", NON_NEGATIVE)
    label_smoothing: float = optimisation_key(
        0.0, "cross-entropy label smoothing, in [0, 1)", rule(lambda v: 0 <= v < 1, "must be in [0, 1)"))
    grad_clip: float = optimisation_key(
        1.0, "max global norm of the averaged gradients; 0 = no clipping", NON_NEGATIVE)
    target_acc: float = optimisation_key(
        0.0, "test accuracy whose first epoch and time go into eval.json; 0 = none", FRACTION)
    sync: str = distribution_key(
        SYNC_METHODS[0], "how the ranks share gradients (docs/SYNC_METHODS.md; the default: the first of "
        "hvd_cifar/core/methods.py's methods); each method's own keys are in its group below", choices=SYNC_METHODS)
    compression: str = distribution_key(
        "none", "gradients on the wire, one of hvd_cifar/core/schemes.py's schemes; each scheme's own keys are in "
        "its group below", choices=COMPRESSIONS)
    compression_warmup_steps: int = distribution_key(
        20, "a scheme that replaces the method's averaging: the first updates average the gradients whole",
        NON_NEGATIVE)
    accumulation_steps: int = distribution_key(1, "local forward/backward passes per synchronisation", AT_LEAST_1)
    freeze: int | str = distribution_key(
        0, "leading feature blocks that do not train, or auto (hvd_cifar/trainer/freezing.py)", _freeze_rule)
    freeze_auto_threshold: float = distribution_key(
        0.02, "freeze: auto: a block freezes once its mean gradient norm changes by less than this from one epoch "
        "to the next (relative)",
        rule(lambda v: v > 0, "must be > 0", "a block freezes when its change is below it; no freezing is freeze: 0"))
    freeze_schedule: dict = distribution_key({}, "{epoch: frozen blocks from that epoch on}", _freeze_schedule_rule)
    elastic: bool = distribution_key(
        False, "Horovod elastic training (horovodrun --min-np/--max-np/--host-discovery-script)")
    commit_every: int = distribution_key(
        10, "elastic: optimizer updates between commits of the state (work lost at most)", AT_LEAST_1)
    liveness_timeout_s: float = distribution_key(
        30.0, "seconds a rank's heartbeat to rank 0 (or rank 0's to it) may go unheard before its host counts as "
        "dropped off the network and the job ends; 0 = off",
        rule(lambda v: v == 0 or v >= 1, "must be 0 (off) or >= 1 (seconds)"))
    comm_timeline: bool = distribution_key(
        False, "record when communication ran (Horovod: its timeline, RUN/timeline.json; DDP: a comm hook): "
        "comm_hidden_s / comm_exposed_s per epoch")
    nic: str = distribution_key(
        "auto", "interface whose byte counters are recorded per host; auto = busiest non-loopback; a named one must "
        "exist")
    seed: int = run_key(0, "the initial weights, the shuffling and the augmentation", NON_NEGATIVE)
    threads_per_rank: int = run_key(
        0, "torch intra-op threads; 0 = cores on the host / ranks on the host; at most the usable CPUs", NON_NEGATIVE)
    max_steps_per_epoch: int = run_key(
        0, "0 = the full epoch; >0 cuts epochs short (quick runs, benchmarks)", NON_NEGATIVE)
    eval_batch_size: int = run_key(500, "images per rank per evaluation batch", AT_LEAST_1)
    log_dir: str = run_key("logs", "run folders are created under here")
    run_name: str = run_key(
        "", '"" = timestamped unique name',
        rule(lambda v: os.sep not in v and v not in (".", ".."), "must be a plain folder name"))
    checkpoint_every: int = run_key(1, "epochs between checkpoints; 0 = only at the end", NON_NEGATIVE)
    stop_after: int = run_key(
        0, "end the run after this many epochs (0 = all); the schedule still spans `epochs`", NON_NEGATIVE)
    resume: str = run_key("", "run folder (or run name under log_dir) to continue")
    progress: bool = run_key(True, "tqdm bar on rank 0")
    tensorboard: bool = run_key(
        True, "rank 0 also writes each metrics line into TensorBoard event files in the run folder")
    # The keys settled at run time: {key: (the value given, why it was settled)}. Not a key of
    # the config: config.yaml holds the values given, resolved.yaml the values settled.
    settled: Mapping[str, tuple[Any, str]] = field(default_factory=dict, compare=False, repr=False)

    def validate(self) -> Config:
        """Each key on its own (its type, choices and rule), then the rules that tie keys
        together (core.combinations, from the registries' capabilities); returns the copy the
        run uses, lr and compute's precision and layout settled."""
        for key in FIELDS:
            if problem := key_problem(key, getattr(self, key)):
                raise ConfigError(f"{key}: {problem}")
        cfg = self.settle(f"0 asks for {self.model}'s default rate", lr=self.lr or MODEL_LR[self.model])
        cfg = combinations.settle_compute(cfg, COMPUTE_SETTINGS)
        combinations.check(cfg)
        return cfg

    def settle(self, why: str, **values: Any) -> Config:
        """A copy with ``values``, each key that changes recorded with ``why`` and the value given."""
        changed = {key: value for key, value in values.items() if getattr(self, key) != value}
        settled = {**self.settled, **{key: (self.settled.get(key, (getattr(self, key),))[0], why) for key in changed}}
        return dataclasses.replace(self, **changed, settled=settled) if changed else self

    def to_dict(self) -> dict[str, Any]:
        """Every key's value, as the run uses it."""
        return {key: getattr(self, key) for key in FIELDS}

    def given(self) -> dict[str, Any]:
        """The keys as given (config.yaml): the settled ones at the value given; each scheme's
        own keys only under that compression (elsewhere they do nothing, and ``local_sgd_steps``
        beside another compression would read back as its alias, local SGD's switch)."""
        others = {key for key, (name, _) in schemes.settings().items() if name != self.compression}
        return {key: self.settled[key][0] if key in self.settled else value
                for key, value in self.to_dict().items() if key not in others}

    def resolved(self) -> dict[str, dict[str, Any]]:
        """resolved.yaml: ``values`` the run used for the keys settled at run time, ``how`` why."""
        return {"values": {key: getattr(self, key) for key in self.settled},
                "how": {key: why for key, (_, why) in self.settled.items()}}

    def save(self, path: str, resolved_path: str | None = None) -> None:
        """config.yaml (and resolved.yaml), each written whole or not at all (temp file + rename)."""
        for target, content in ((path, self.given()), (resolved_path, self.resolved())):
            if target:
                atomic_write(target, lambda f, c=content: f.write(yaml.safe_dump(c, sort_keys=False).encode()))


def _registry_field(group: str, setting) -> tuple[Any, Any]:
    return setting.annotation, field(default=setting.default, metadata={
        "group": group, "meaning": setting.meaning, "choices": (),
        "rule": lambda value: f"{setting.rule}, got {value!r}" if setting.problem(value) else ""})


# The run's config: the keys above, then each sync method's and each compression scheme's own.
Config = dataclasses.make_dataclass(
    "Config", [(key, *_registry_field(f"{kind}: {name}", setting))
               for kind, registry in (("sync", methods), ("compression", schemes))
               for key, (name, setting) in registry.settings().items()],
    bases=(CoreKeys,), frozen=True,
    namespace={"__module__": __name__, "__doc__": "The run's config: the core keys, then each sync method's "
                                                  "and each compression scheme's own (their registries')."})
FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "settled"}  # the config's keys
CHOICES = {key: f.metadata["choices"] for key, f in FIELDS.items() if f.metadata["choices"]}  # one of a list
HINTS = typing.get_type_hints(Config)


def value_kinds(key: str) -> tuple[tuple[type, ...], bool]:
    """The types a key's value may have, and whether it may be null."""
    kind = aliases.KINDS.get(key) or HINTS[key]
    kinds = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    return tuple(typing.get_origin(k) or k for k in kinds if k is not type(None)), type(None) in kinds


def _type_problem(key: str, value: Any) -> str:
    kinds, optional = value_kinds(key)
    if (value is None and optional) or (float in kinds and isinstance(value, int) and not isinstance(value, bool)):
        return ""
    if isinstance(value, kinds) and not (int in kinds and isinstance(value, bool)):
        return ""
    return f"expected {' or '.join(k.__name__ for k in kinds)}, got {value!r} ({type(value).__name__})"


def key_problem(key: str, value: Any) -> str:
    """What is wrong with ``value`` for ``key`` on its own ('' when nothing)."""
    choices, check = FIELDS[key].metadata["choices"], FIELDS[key].metadata["rule"]
    if problem := _type_problem(key, value):
        return problem
    if choices and value not in choices:
        return f"{value!r} is not one of {', '.join(choices)}"
    return check(value) if check else ""


def settings_for(kind: type, cfg: Config):
    """The typed settings a part of the trainer reads (``kind``, a dataclass whose fields are
    config keys), taken from ``cfg``: what that part is given instead of the whole Config."""
    return kind(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(kind)})


def _is_bool(key: str) -> bool:
    kind = aliases.KINDS.get(key) or HINTS[key]
    return kind is bool or bool in typing.get_args(kind)


def _coerce(key: str, value: Any, from_cli: bool) -> Any:
    """``value`` checked against the key's type; a flag's word is read as a YAML scalar first."""
    kinds, optional = value_kinds(key)
    raw = value
    if from_cli and isinstance(value, str) and kinds != (str,):  # a string key keeps its word
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"{key}: cannot parse {value!r}") from None
    if value is None and optional:
        return None
    if dict in kinds and not isinstance(value, dict):
        if value is None:
            return {}
        raise ConfigError(f"{key}: expected a mapping such as '{{0: 0, 10: 2}}' (a space after each "
                          f"colon), got {raw!r}")
    if float in kinds and isinstance(value, str):
        # YAML 1.1 reads 1e30 (no dot, no sign in the exponent) as a string; it is a number.
        with contextlib.suppress(ValueError):
            value = float(value)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if float in kinds and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {raw!r}")
    if problem := _type_problem(key, value):
        raise ConfigError(f"{key}: {problem}")
    return value


def typed(values: dict[str, Any], from_cli: bool = False) -> tuple[dict[str, Any], list[str]]:
    """One layer's values typed, its aliases read (core.aliases), and the lines that say so."""
    for key in values:
        if key not in FIELDS and key not in aliases.KINDS:
            raise flags.unknown(key, FIELDS)
    return aliases.read({key: _coerce(key, value, from_cli) for key, value in values.items()})


FLAGS = {key: _is_bool(key) for key in (*FIELDS, *aliases.KINDS)}


def parse_flags(argv: list[str]) -> tuple[str | None, dict[str, str]]:
    """The command line as (its --config file or None, {key: the word given})."""
    return flags.parse(argv, FLAGS)


def layers(argv: list[str], base: dict[str, Any] | None = None) -> list[tuple[dict[str, Any], list[str]]]:
    """The layers over the defaults, lowest first: ``base``, the --config file, the flags; each
    typed, with the lines its aliases said."""
    config_file, flag_values = parse_flags(argv)
    return [typed(base or {}), typed(load_yaml(config_file) if config_file else {}), typed(flag_values, True)]


def from_args(argv: list[str], base: dict[str, Any] | None = None) -> Config:
    """Defaults < ``base`` (a saved run's config, when resuming) < YAML file < flags, validated."""
    values: dict[str, Any] = {}
    for layer, _ in layers(argv, base):
        values.update(layer)
    return check_host(Config(**values).validate())


def given_keys(argv: list[str]) -> set[str]:
    """The keys a command line sets, by flag or through its --config file, aliases read (not the
    defaults, nor a resumed run's saved config)."""
    return {key for layer, _ in layers(argv)[1:] for key in layer}


def aliases_read(argv: list[str]) -> list[str]:
    """One line per alias the command line (its flags, its --config file) spells."""
    return [line for _, said in layers(argv)[1:] for line in said]


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
