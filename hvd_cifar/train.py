"""Data-parallel training of a CNN on CIFAR-style data, gradients synchronised by Horovod
(or another method behind ``hvd_cifar.sync``).

Launch it any of these ways; the code is the same:

    horovodrun -np 2 -H localhost:2 python -m hvd_cifar.train --config configs/demo.yaml
    horovodrun --gloo -np 2 -H localhost:2 python -m hvd_cifar.train --config configs/demo.yaml
    launch/horovodrun.sh -np 4 -hostfile hostfiles/example-cluster --config configs/cifar10_vgg11.yaml
    mpirun -np 2 -bind-to none -map-by slot python -m hvd_cifar.train --config configs/tiny.yaml
    python -m hvd_cifar.train --config configs/tiny.yaml            # one process

Every rank computes; rank 0 speaks (progress bar, printed lines, run folder files).
Each epoch appends one line to logs/RUN_NAME/metrics.jsonl before anything is printed.
"""
from __future__ import annotations

import hashlib
import math
import os
import socket
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from tqdm import tqdm

from hvd_cifar import config as config_mod
from hvd_cifar import data, netstats, runlog
from hvd_cifar.config import Config, ConfigError
from hvd_cifar.data import DataError
from hvd_cifar.models import build_model, set_frozen_blocks
from hvd_cifar.runlog import RunError
from hvd_cifar.sync import SyncMethod, abort_job, exit_process, launch_rank, lost_peer, make as make_sync

USER_ERRORS = (ConfigError, DataError, RunError)
PHASES = ("data", "forward", "backward", "sync", "optimizer")


def load_config(argv: list[str]) -> Config:
    cfg = config_mod.from_args(argv)
    if cfg.resume:  # a resumed run starts from its saved config; flags (e.g. --epochs) still win
        run_dir = runlog.resolve_resume(cfg.resume, cfg.log_dir)
        saved = config_mod.load_yaml(os.path.join(run_dir, "config.yaml"))
        saved.pop("resume", None)
        cfg = config_mod.from_args(argv, base=saved)
        cfg.resume = run_dir
    return cfg


def lr_at(update: int, cfg: Config, peak: float, updates_per_epoch: int) -> float:
    """Learning rate for optimizer update ``update`` (0-based): linear warm-up, then the schedule."""
    total = cfg.epochs * updates_per_epoch
    warmup = round(cfg.warmup_epochs * updates_per_epoch)
    if update < warmup:
        return peak * (update + 1) / warmup
    progress = (update - warmup) / max(total - warmup, 1)
    if cfg.schedule == "onecycle":
        return peak * max(1.0 - progress, 0.0)
    if cfg.schedule == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return peak * 0.1 ** sum(progress >= m for m in (0.5, 0.75))  # step


def _user_error(name_and_message: tuple[str, str]) -> Exception:
    """A user error rebuilt on this rank from (class name, message) sent by another."""
    name, message = name_and_message
    return {cls.__name__: cls for cls in USER_ERRORS}[name](message)


def on_main(sync: SyncMethod, fn):
    """Run ``fn`` on rank 0 only and hand its result, or its user error, to every rank, so that
    a failure seen by rank 0 alone still stops all ranks together instead of leaving them hung."""
    result, error = None, None
    if sync.rank == 0:
        try:
            result = fn()
        except USER_ERRORS as exc:
            error = (type(exc).__name__, str(exc))
    result, error = sync.broadcast_object((result, error))
    if error:
        raise _user_error(error)
    return result


def on_every_rank(sync: SyncMethod, fn):
    """Run ``fn`` on every rank; a user error on any rank (a data set missing on one host only)
    is raised on all of them, so they stop together with one message instead of hanging."""
    if sync.elastic:
        # Before the elastic loop each worker answers for itself (one that joins later runs this
        # alone); a worker that fails here drops out, and Horovod's driver carries on without it.
        return fn()
    result, error = None, None
    try:
        result = fn()
    except USER_ERRORS as exc:
        error = (type(exc).__name__, str(exc))
    errors = [e for e in sync.allgather_object(error) if e]
    if errors:
        raise _user_error(errors[0])
    return result


def build_optimizer(model, cfg: Config, sync: SyncMethod, old=None):
    """SGD over the trainable parameters only, wrapped by the sync method; momentum buffers of
    parameters that stay trainable carry over from ``old``."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.ndim > 1]           # no weight decay on biases / BN
    no_decay = [p for n, p in named if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": cfg.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if old is not None:
        for _, p in named:
            if p in old.state:
                opt.state[p] = old.state[p]
    model, opt = sync.wrap(model, opt, named, cfg.accumulation_steps, cfg.fp16_allreduce)
    payload = sum(p.numel() * (2 if cfg.fp16_allreduce else p.element_size()) for _, p in named)
    return model, opt, payload, sum(p.numel() for _, p in named)


def average_buffers(model: torch.nn.Module, sync: SyncMethod) -> None:
    """Average the floating-point buffers (BatchNorm's running statistics) over the ranks.
    Each rank's statistics come from its own shard only; after this every rank evaluates, and
    rank 0 checkpoints, one and the same model, so a resumed run continues exactly."""
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    if sync.size == 1 or not buffers:
        return
    flat = torch.cat([b.detach().reshape(-1).double().cpu() for b in buffers])
    flat = sync.allreduce_sum(flat) / sync.size
    offset = 0
    with torch.no_grad():
        for b in buffers:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()


def evaluate(model, ds: data.DataSet, loader: data.ShardedLoader, cfg: Config, sync: SyncMethod,
             amp_ctx) -> tuple[float, float, torch.Tensor]:
    """Loss, accuracy and confusion matrix over the whole test set, sharded across ranks."""
    model.eval()
    k = ds.num_classes
    confusion = torch.zeros(k, k, dtype=torch.float64)
    loss_sum = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for x, y in data.eval_batches(ds.test_images, ds.test_labels, cfg.eval_batch_size,
                                      sync.rank, sync.size, loader.normalize):
            with amp_ctx():
                out = model(x)
            loss_sum += F.cross_entropy(out.float(), y, reduction="sum").double().cpu()
            pairs = (y * k + out.argmax(1)).cpu()
            confusion += torch.bincount(pairs, minlength=k * k).view(k, k).double()
    totals = sync.allreduce_sum(torch.cat([confusion.flatten(), loss_sum.view(1)]))
    confusion = totals[:-1].view(k, k)
    n = confusion.sum().item()
    return totals[-1].item() / n, confusion.diag().sum().item() / n, confusion.long()


def classification_summary(confusion: torch.Tensor) -> tuple[str, dict]:
    """scikit-learn's report, from (true, predicted) pairs rebuilt from the confusion matrix."""
    import numpy as np
    from sklearn.metrics import classification_report

    k = confusion.shape[0]
    counts = confusion.flatten().numpy()
    pairs = np.repeat(np.arange(k * k), counts)
    y_true, y_pred = pairs // k, pairs % k
    labels = list(range(k))
    text = classification_report(y_true, y_pred, labels=labels, digits=4, zero_division=0)
    as_dict = classification_report(y_true, y_pred, labels=labels, output_dict=True, zero_division=0)
    return text, as_dict


def run(cfg: Config) -> int:
    sync = make_sync(cfg.sync, cfg.elastic)  # starts the communication backend (hvd.init() for Horovod)
    threads = cfg.threads_per_rank or max(1, (os.cpu_count() or 1) // sync.local_size)
    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        torch.cuda.set_device(sync.local_rank)  # one GPU per local rank
        device = torch.device("cuda", sync.local_rank)
    else:
        device = torch.device("cpu")

    # ---- run folder: rank 0 creates (or reopens) it, every rank learns where it is. Elastic:
    # nothing before the elastic loop may wait on another rank (a worker that joins later runs
    # this part alone), so the training state carries rank 0's answer to the others instead.
    resuming = bool(cfg.resume)
    if sync.elastic:
        run_dir = cfg.resume or (runlog.create_run_dir(cfg, sync.size) if sync.rank == 0 else "")
    else:
        run_dir = on_main(sync, lambda: cfg.resume if resuming else runlog.create_run_dir(cfg, sync.size))

    # ---- data: every rank holds the whole set in memory (downloads take turns on a lock)
    if cfg.download:
        on_every_rank(sync, lambda: data.download(cfg.dataset, cfg.data_dir))
    ds = on_every_rank(sync, lambda: data.load(cfg.dataset, cfg.data_dir, cfg.synthetic_size, cfg.seed))
    mean, std = ds.channel_stats()
    ds.to(device)
    loader = data.ShardedLoader(ds.train_images, ds.train_labels, cfg.batch_size, sync.rank,
                                sync.size, cfg.seed, mean.to(device), std.to(device),
                                augment=cfg.augment, hflip=ds.hflip,
                                max_steps=cfg.max_steps_per_epoch, channels_last=cfg.channels_last)
    k = cfg.accumulation_steps

    # ---- model: same seed everywhere, then rank 0's weights broadcast to be sure
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, ds.num_classes, cfg.batchnorm).to(device)
    # channels_last applies to the input batches only: convolutions then run in NHWC, while the
    # parameters (and, by autograd's layout contract, their gradients) stay contiguous, which
    # is what allreduce and broadcast of flat buffers require.
    depth = len(model.feature_blocks)
    for frozen in (cfg.freeze, *cfg.freeze_schedule.values()):
        if frozen > depth:
            raise ConfigError(f"freeze: {frozen} blocks asked for but {cfg.model} has {depth}")
    use_amp = cfg.amp != "none"
    amp_dtype = torch.float16 if cfg.amp == "fp16" else torch.bfloat16
    amp_ctx = lambda: torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp)  # noqa: E731
    scaler = torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None

    # ---- resume: rank 0 reads the checkpoint and hands it to every rank (elastic: every rank
    # reads it, and the state's first broadcast makes sure they agree)
    identity = runlog.checkpoint_identity(cfg, ds.num_classes)
    if not resuming:
        ckpt = None
    elif sync.elastic:
        ckpt = runlog.load_checkpoint(run_dir, identity)
    else:
        ckpt = on_main(sync, lambda: runlog.load_checkpoint(run_dir, identity))
    start_epoch = ckpt["epoch"] if ckpt else 0
    frozen = cfg.frozen_blocks(start_epoch)
    set_frozen_blocks(model, frozen)
    net, optimizer, payload_bytes, trainable = build_optimizer(model, cfg, sync)
    if ckpt:
        mismatch = runlog.state_dict_mismatch(model.state_dict(), ckpt["model"])
        if mismatch:
            raise RunError(f"resume: the checkpoint's weights do not fit this {cfg.model} ({mismatch}); "
                           f"was it saved with other model settings (e.g. batchnorm)?")
        try:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise RunError(f"resume: checkpoint does not fit this model/optimizer "
                           f"({str(exc).splitlines()[0]})") from None
        if scaler is not None and "scaler" in ckpt:
            scaler.load_state_dict(ckpt["scaler"])
        del ckpt

    # What survives a reset of elastic training (committed every cfg.commit_every updates and at
    # each epoch's end, broadcast from rank 0 to workers that join): weights, optimizer, where
    # the epoch stands (steps taken, images consumed) and the epoch's loss/accuracy sums so far.
    state = sync.training_state(model, optimizer, run_dir=run_dir, epoch=start_epoch, step=0,
                                position=0, totals=[0.0, 0.0, 0.0], restarts=0)
    progress = {"epoch": start_epoch, "step": 0}  # how far this worker got, committed or not
    end_epoch = min(cfg.epochs, cfg.stop_after) if cfg.stop_after else cfg.epochs

    @sync.run_elastic
    def train(state) -> None:
        nonlocal net, optimizer, payload_bytes, trainable, frozen
        # ---- (re)start: every rank is here with rank 0's state; ranks may have changed
        is_main = sync.rank == 0
        run_dir = state.run_dir
        cfg.run_name, cfg.log_dir = os.path.basename(run_dir), os.path.dirname(run_dir)
        log = runlog.RankLog(run_dir, sync.rank, echo=is_main)
        hostnames = sync.allgather_object(socket.gethostname())
        if state.restarts == 0:
            if is_main:  # a resumed run may have changed e.g. epochs: the folder's config says what ran
                cfg.save(os.path.join(run_dir, "config.yaml"))
            if is_main and not resuming:
                runlog.write_json(os.path.join(run_dir, "meta.json"),
                                  runlog.run_metadata(sync.size, hostnames, sync.name, str(device)))
            if is_main and resuming:
                runlog.truncate_metrics(run_dir, start_epoch)
                runlog.remove_stale_temp_files(run_dir)
            log(f"run folder {run_dir}: {cfg.model} on {cfg.dataset}, {sync.size} rank(s) "
                f"({', '.join(sorted(set(hostnames)))}), sync={cfg.sync}, device={device}, threads/rank={threads}")
            if resuming:
                log(f"resuming after epoch {start_epoch} of {cfg.epochs}")
        if sync.elastic:
            lost = max(0, progress["step"] - state.step) if progress["epoch"] == state.epoch else 0
            if is_main:
                runlog.append_metrics(run_dir, {
                    "event": "start" if state.restarts == 0 else "reset", "time": time.time(),
                    "world_size": sync.size, "hosts": sorted(set(hostnames)), "epoch": state.epoch,
                    "step": state.step, "position": state.position, "steps_lost": lost}, runlog.EVENTS)
            if state.restarts:
                log(f"workers changed: now {sync.size} rank(s) on {', '.join(sorted(set(hostnames)))}; "
                    f"continuing epoch {state.epoch + 1} at step {state.step} ({lost} step(s) redone)")
        state.restarts += 1
        if sync.elastic:
            state.commit()  # from here on a reset is a restart, not the run's start
        if not sync.elastic:
            sync.broadcast_state(model)  # elastic: the state's sync already broadcast it
        loader.reshard(sync.rank, sync.size)
        peak_lr = cfg.lr * sync.size * k  # linear scaling with the effective batch (ranks x accumulation)
        updates_per_epoch = math.ceil(len(loader) / k)
        # One rank per host reads that host's interface counters around each epoch's training.
        host = socket.gethostname()
        nic = netstats.NicMeter(netstats.pick_interface(cfg.nic) if sync.local_rank == 0 else None)

        def timed(phase: str, since: float) -> float:
            if device.type == "cuda":
                torch.cuda.synchronize()  # so that a phase's time is its own, not the next one's
            now = time.perf_counter()
            timers[phase] += now - since
            return now

        final_confusion = test_loss = None
        while state.epoch < end_epoch:
            epoch = state.epoch
            # ---- layer freezing schedule: a new trainable set needs a new optimizer and sync hooks
            if cfg.frozen_blocks(epoch) != frozen:
                frozen = cfg.frozen_blocks(epoch)
                set_frozen_blocks(model, frozen)
                net, optimizer, payload_bytes, trainable = build_optimizer(model, cfg, sync, old=optimizer)
                state.optimizer = optimizer
                sync.broadcast_state(model)
                log(f"epoch {epoch}: {frozen} feature block(s) frozen, {trainable:,} trainable parameters")
            net.train()
            set_frozen_blocks(model, frozen)  # train() switched frozen BatchNorm back to batch stats

            timers = dict.fromkeys(PHASES, 0.0)
            stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, images
            first, start = state.step, state.position  # where this pass over the epoch begins
            steps = first + loader.steps_left(start, first)
            batches = loader.epoch(epoch, start, first)
            bar = tqdm(total=steps, initial=first, desc=f"epoch {epoch + 1}/{cfg.epochs}",
                       disable=not (is_main and cfg.progress), leave=False, dynamic_ncols=True)
            syncs = 0
            nic.start()
            epoch_start = t = time.perf_counter()
            for step in range(first, steps):
                x, y = next(batches)
                t = timed("data", t)
                micro = step % k
                group_start = step - micro
                group_size = min(k, steps - group_start)  # an epoch's tail may hold fewer than k
                last_micro = micro == group_size - 1
                with sync.accumulate(net, sync_now=last_micro):
                    with amp_ctx():
                        out = net(x)
                        loss = F.cross_entropy(out, y, label_smoothing=cfg.label_smoothing)
                    t = timed("forward", t)
                    # Mean over the update's micro-batches, so k accumulated steps equal one k-times batch.
                    scaled = loss / group_size
                    (scaler.scale(scaled) if scaler else scaled).backward()
                    t = timed("backward", t)
                if last_micro:
                    update = epoch * updates_per_epoch + step // k
                    for group in optimizer.param_groups:
                        group["lr"] = lr_at(update, cfg, peak_lr, updates_per_epoch)
                    sync.synchronize(optimizer)
                    t = timed("sync", t)
                    sync.step(optimizer, scaler)
                    optimizer.zero_grad()  # set_to_none by default in torch 2
                    syncs += 1
                    t = timed("optimizer", t)
                with torch.no_grad():
                    stats[0] += loss.detach().double() * len(y)
                    stats[1] += (out.argmax(1) == y).sum()
                    stats[2] += len(y)
                progress.update(epoch=epoch, step=step + 1)
                if sync.elastic:
                    state.position += loader.step_images(step - first, start)
                    state.step = step + 1
                    if last_micro and (step // k + 1) % cfg.commit_every == 0 and step + 1 < steps:
                        # Fold this stretch's sums into the state, so that a reset keeps them
                        # exactly as far as the weights go; then save, and hear of new workers.
                        state.totals = (torch.tensor(state.totals, dtype=torch.float64)
                                        + sync.allreduce_sum(stats.cpu())).tolist()
                        stats.zero_()
                        state.commit()
                bar.update(1)
                t = time.perf_counter()
            bar.close()
            epoch_time = time.perf_counter() - epoch_start
            nic_bytes = nic.stop()
            gathered = sync.allgather_object((host, nic.interface, *nic_bytes) if nic.interface else None)
            per_host = [entry for entry in gathered if entry]  # (host, interface, rx, tx)

            stats = sync.allreduce_sum(stats.cpu())
            pass_images = stats[2].item()  # trained since this pass over the epoch began
            stats += torch.tensor(state.totals, dtype=torch.float64)  # elastic: and before a reset
            # Each rank timed its own phases; report the mean over ranks, which adds up to the step time.
            phase_times = sync.allreduce_sum(torch.tensor([timers[p] for p in PHASES], dtype=torch.float64)) / sync.size
            eval_start = time.perf_counter()
            average_buffers(model, sync)
            test_loss, test_acc, confusion = evaluate(net, ds, loader, cfg, sync, amp_ctx)
            eval_time = time.perf_counter() - eval_start
            images = stats[2].item()
            record = {
                "epoch": epoch,
                "lr": optimizer.param_groups[0]["lr"],
                "train_loss": stats[0].item() / images,
                "train_acc": stats[1].item() / images,
                "test_loss": test_loss,
                "test_acc": test_acc,
                "epoch_time_s": epoch_time,
                "eval_time_s": eval_time,
                "images_per_s": pass_images / epoch_time,
                "steps": steps,
                "syncs": syncs,
                "step_time_s": epoch_time / (steps - first),
                **{f"{phase}_time_s": phase_times[j].item() for j, phase in enumerate(PHASES)},
                "comm_bytes_per_sync": sync.wire_bytes_per_sync(payload_bytes),
                "comm_bytes_per_rank": sync.wire_bytes_per_sync(payload_bytes) * syncs,
                "nic_interface": {h: iface for h, iface, _, _ in per_host},
                "nic_rx_bytes": {h: rx for h, _, rx, _ in per_host},
                "nic_tx_bytes": {h: tx for h, _, _, tx in per_host},
                "trainable_params": trainable,
                "frozen_blocks": frozen,
                "world_size": sync.size,
                "sync": cfg.sync,
                "fp16_allreduce": cfg.fp16_allreduce,
                "accumulation_steps": k,
                "batch_size": cfg.batch_size,
            }
            if first:  # elastic: the epoch was continued after a reset at step `first`
                record["resumed_at_step"] = first
            if is_main:
                if sync.elastic:  # a reset after this line and before the next commit reruns the epoch's end
                    runlog.truncate_metrics(run_dir, epoch)
                runlog.append_metrics(run_dir, record)  # data first, print second
            log(f"epoch {epoch + 1}/{cfg.epochs}  train loss {record['train_loss']:.4f} acc {record['train_acc']:.4f}"
                f"  test loss {test_loss:.4f} acc {test_acc:.4f}  {epoch_time:.1f} s  "
                f"{record['images_per_s']:.0f} img/s  lr {record['lr']:.4g}")
            last_epoch = epoch == end_epoch - 1
            if is_main and ((cfg.checkpoint_every and (epoch + 1) % cfg.checkpoint_every == 0) or last_epoch):
                ckpt = {"epoch": epoch + 1, "identity": identity, "config": cfg.to_dict(),
                        "model": model.state_dict(), "optimizer": optimizer.state_dict()}
                if scaler is not None:
                    ckpt["scaler"] = scaler.state_dict()
                runlog.save_checkpoint(run_dir, ckpt)
            if epoch == cfg.epochs - 1:
                final_confusion = confusion
            state.epoch, state.step, state.position, state.totals = epoch + 1, 0, 0, [0.0, 0.0, 0.0]
            if sync.elastic and not last_epoch:
                state.commit()

        # Data-parallel ranks must end with identical parameters; say so (or not) in eval.json.
        digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters()))
        ranks_agree = len(set(sync.allgather_object(digest.hexdigest()))) == 1
        if not ranks_agree:
            log("WARNING: ranks finished with different parameters")
        if final_confusion is not None and is_main:
            report_text, report = classification_summary(final_confusion)
            test_acc = final_confusion.diag().sum().item() / final_confusion.sum().item()
            runlog.write_json(os.path.join(run_dir, "eval.json"), {
                "test_acc": test_acc, "test_loss": test_loss, "classes": ds.num_classes,
                "confusion_matrix": final_confusion.tolist(), "classification_report": report,
                "parameters_identical_across_ranks": ranks_agree})
            log("classification report (test set):\n" + report_text)
            log("confusion matrix (rows: true class, columns: predicted):\n" + format_matrix(final_confusion))
            log(f"final test accuracy {test_acc:.4f}; run folder {run_dir}")
        log.close()

    train(state)
    # The wrappers the sync method made hold its communication resources (DDP's reducer holds
    # the process group): let them go before the method closes.
    del net, optimizer, state
    sync.close()
    return 0


def format_matrix(m: torch.Tensor) -> str:
    width = max(len(str(int(m.max()))), 3)
    head = " " * 5 + " ".join(f"{j:>{width}}" for j in range(m.shape[1]))
    rows = [f"{i:>4} " + " ".join(f"{int(v):>{width}}" for v in row) for i, row in enumerate(m.tolist())]
    return "\n".join([head, *rows])


SILENT_RANK_EXIT_DELAY_S = 5.0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rank = launch_rank()
    try:
        return run(load_config(argv))
    except USER_ERRORS as exc:
        # Bad input is seen by every rank alike (or handed to all by on_main): one line, from rank 0.
        if rank == 0:  # one write: launchers that tag output lines would tag a lone newline too
            sys.stderr.write(f"hvd_cifar: error: {exc}\n")
            sys.stderr.flush()
        else:
            # Launchers stop the whole job when the first rank exits non-zero. A silent rank
            # that got there first would have rank 0 killed before it said why; so the others
            # give rank 0 time to speak. Normally rank 0 exits first and the launcher ends
            # the job then, so this wait costs nothing.
            time.sleep(SILENT_RANK_EXIT_DELAY_S)
        return 2
    except KeyboardInterrupt:
        abort_job(130)
    except Exception as exc:
        if lost_peer(exc):  # another rank failed first and says why; this one only stops
            first = (str(exc).strip().splitlines() or [""])[0].split(". ")[0]
            sys.stderr.write(f"hvd_cifar: rank {rank} stopped: another rank failed or left "
                             f"({type(exc).__name__}: {first[:160]})\n")
        else:  # a fault on this rank alone: say so once, then take the whole job down
            sys.stderr.write(f"hvd_cifar: rank {rank} failed:\n{traceback.format_exc()}")
        abort_job(1)
    return 1


if __name__ == "__main__":
    exit_process(main())
