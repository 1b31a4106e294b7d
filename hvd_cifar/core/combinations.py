"""The config's rules that tie keys together: what each combination of settings can honour,
and what to give instead when it cannot (``ConfigError.fixes``; ``Config.validate`` calls
``check`` after each key was checked on its own), and which keys a combination leaves without
effect (``inert_keys``: a warning, not a refusal). What a sync method or a compression scheme
can be combined with is read from its registry entry's capabilities (core.methods,
core.schemes), never from its name."""
from __future__ import annotations

from hvd_cifar.core import methods, schemes
from hvd_cifar.core.errors import ConfigError


def settle_compute(cfg, settings: dict[str, tuple[str, bool]]):
    """compute naming one setting gives amp and channels_last (a copy, the two settled); a
    different amp or channels_last given with it is a contradiction (auto and fixed leave them
    as they are)."""
    if cfg.compute not in settings:
        return cfg
    amp, channels_last = settings[cfg.compute]
    if cfg.amp not in ("none", amp):
        raise ConfigError(f"amp: {cfg.amp} contradicts compute: {cfg.compute}",
                          fixes=(["--amp", amp], ["--compute", "fixed"]))
    if cfg.channels_last and not channels_last:
        raise ConfigError(f"channels_last: true contradicts compute: {cfg.compute}",
                          fixes=(["--no-channels-last"], ["--compute", f"{cfg.compute}-channels-last"]))
    return cfg.settle(f"from compute: {cfg.compute}", amp=amp, channels_last=channels_last)


def check(cfg) -> None:
    """Every rule that ties keys together, the core keys' first."""
    if cfg.nesterov and cfg.momentum == 0:
        raise ConfigError("nesterov: needs momentum > 0")
    if cfg.warmup_epochs > cfg.epochs:
        raise ConfigError(f"warmup_epochs: {cfg.warmup_epochs} is longer than epochs ({cfg.epochs})")
    if not cfg.batchnorm and cfg.model == "resnet18":
        raise ConfigError("batchnorm: resnet18 is only built with BatchNorm")
    check_freeze(cfg)
    check_method(cfg)
    if schemes.replaces_averaging(cfg.compression):
        check_scheme(cfg)


def check_freeze(cfg) -> None:
    """freeze and freeze_schedule: not with what they cannot honour (elastic, a method whose
    ranks do not average their gradients)."""
    if cfg.elastic and (cfg.freeze_schedule or cfg.freeze == "auto"):
        # A worker that joins mid-run builds its optimizer before it learns the epoch, or the
        # policy's decisions.
        key = "freeze_schedule" if cfg.freeze_schedule else "freeze: auto"
        raise ConfigError(f"{key}: not with elastic: true",
                          fixes=((["--freeze-schedule", "{}"] if cfg.freeze_schedule else ["--freeze", "0"]),
                                 ["--no-elastic"]))
    if cfg.freeze == "auto" and cfg.freeze_schedule:
        raise ConfigError("freeze_schedule: not with freeze: auto (the policy decides what is frozen)",
                          fixes=(["--freeze-schedule", "{}"], ["--freeze", "0"]))
    if cfg.freeze == "auto" and not methods.METHODS[cfg.sync].averages_gradients:
        # Its ranks' gradients are their own, never averaged: ranks would decide apart.
        raise ConfigError(f"freeze: auto needs gradients averaged over the ranks, and sync: {cfg.sync} has none",
                          fixes=(["--freeze", "0"], ["--sync", methods.with_capability("averages_gradients")[0]]))


def takes_grad_scaler(cfg) -> bool:
    """Whether amp: fp16's loss scaling works with the sync method and the compression."""
    return methods.METHODS[cfg.sync].takes_grad_scaler and schemes.SCHEMES[cfg.compression].takes_grad_scaler


def _amp_fixes(cfg) -> tuple[list[str], ...]:
    """What to give instead of amp: fp16: another amp, or, where compute named fp16, another compute."""
    if "amp" in cfg.settled:  # compute: fp16 or fp16-channels-last gave it
        return ["--compute", cfg.compute.replace("fp16", "bf16")], ["--compute", "auto"]
    return ["--amp", "bf16"], ["--amp", "none"]


def _sync_fixes(capability: str) -> tuple[list[str], ...]:
    return tuple(["--sync", name] for name in methods.with_capability(capability))


def check_method(cfg) -> None:
    """What the sync method's entry says it can do: elastic training, a timeline, the
    compression asked for, amp: fp16; then its own rules."""
    method = methods.METHODS[cfg.sync]
    if cfg.elastic and not method.elastic:
        raise ConfigError(f"elastic: needs sync: {' or '.join(methods.with_capability('elastic'))} (an elastic "
                          f"driver), got sync: {cfg.sync}", fixes=(["--no-elastic"], *_sync_fixes("elastic")))
    if cfg.comm_timeline and not method.timeline:
        raise ConfigError(f"comm_timeline: needs sync: {' or '.join(methods.with_capability('timeline'))}, got "
                          f"sync: {cfg.sync}", fixes=(["--no-comm-timeline"],))
    spec = schemes.SCHEMES[cfg.compression]
    if schemes.replaces_averaging(cfg.compression) and not method.runs_schemes:
        runners = methods.with_capability("runs_schemes")
        raise ConfigError(f"compression: {cfg.compression}: needs sync: {' or '.join(runners)}, got sync: {cfg.sync}",
                          fixes=_sync_fixes("runs_schemes"))
    if spec.native and spec.native not in method.native:
        doing = [name for name, m in methods.METHODS.items() if spec.native in m.native]
        raise ConfigError(f"compression: {cfg.compression}: not with sync: {cfg.sync} (the {method.title} sends "
                          f"{', '.join(method.native) or 'fp32'} only)",
                          fixes=(["--compression", "none"], *(["--sync", name] for name in doing[:1])))
    if cfg.amp == "fp16" and not method.takes_grad_scaler:
        raise ConfigError(f"amp: fp16 needs a grad scaler, which sync: {cfg.sync} does not keep",
                          fixes=_amp_fixes(cfg))
    if method.check:
        method.check(cfg)


def check_scheme(cfg) -> None:
    """A scheme that replaces the method's averaging: not with what it cannot honour (its
    entry's capabilities), then its own rules."""
    spec, what = schemes.SCHEMES[cfg.compression], f"compression: {cfg.compression}"
    if cfg.elastic:
        raise ConfigError(f"{what}: not with elastic: true (its state is not part of a commit)",
                          fixes=(["--no-elastic"],))
    if cfg.comm_timeline:
        raise ConfigError(f"{what}: not with comm_timeline: true (it communicates after backward, "
                          f"nothing is overlapped to time)", fixes=(["--no-comm-timeline"],))
    if cfg.amp == "fp16" and not spec.takes_grad_scaler:
        raise ConfigError(f"{what}: not with amp: fp16 (its error feedback would carry loss-scaled "
                          f"gradients across changes of the scale)", fixes=_amp_fixes(cfg))
    schemes.check(cfg)
    if cfg.freeze == "auto" and not spec.averages_gradients:
        raise ConfigError(f"{what}: not with freeze: auto, which measures averaged gradients "
                          f"({spec.title} averages none after its warm-up)", fixes=(["--freeze", "0"],))


# Keys that do nothing under the other settings: (key or key prefix, when it is inert, why).
# A key the user gave (YAML or flag) that is inert gets one warning line and is recorded in
# meta.json ("inert_keys"); the run still trains. A method's or a scheme's own keys are inert
# under another method or compression (``inert_keys``).
_INERT = (
    ("compression_warmup_steps", lambda c: not schemes.replaces_averaging(c.compression),
     lambda c: f"the warm-up of {', '.join(schemes.replacing())}, and compression is {c.compression}"),
    ("commit_every", lambda c: not c.elastic, lambda c: "elastic training's commit period, and elastic is false"),
    ("liveness_timeout_s", lambda c: c.elastic, lambda c: "elastic training's driver handles a worker that goes away"),
    ("freeze_auto_threshold", lambda c: c.freeze != "auto", lambda c: f"freeze: auto's threshold, and freeze is {c.freeze}"),
    ("synthetic_size", lambda c: c.dataset != "synthetic", lambda c: f"the synthetic data set's size, and dataset is {c.dataset}"),
    ("shapes_", lambda c: c.dataset != "shapes", lambda c: f"the generated data set's, and dataset is {c.dataset}"),
    ("download", lambda c: c.dataset in ("digits", "synthetic", "shapes"), lambda c: f"{c.dataset} is not downloaded"),
    ("data_dir", lambda c: c.dataset in ("digits", "synthetic"), lambda c: f"{c.dataset} is not read from a folder"),
)


def _inert_own_key(cfg, key: str) -> str | None:
    """Why a sync method's or a scheme's own ``key`` does nothing under ``cfg``, or None."""
    if key in schemes.settings():
        return schemes.inert(cfg, key)
    owner = methods.settings().get(key, (cfg.sync,))[0]
    return None if owner == cfg.sync else f"{methods.METHODS[owner].title}'s own setting, and sync is {cfg.sync}"


def inert_keys(cfg, given: set[str]) -> dict[str, str]:
    """{key: why it does nothing here} for each key in ``given`` that has no effect under the
    validated ``cfg``'s other settings."""
    out = {}
    for key in sorted(given):
        if why := _inert_own_key(cfg, key):
            out[key] = why
        for name, inert, why in _INERT:
            if (key == name or (name.endswith("_") and key.startswith(name))) and inert(cfg):
                out[key] = why(cfg)
    return out
