#!/usr/bin/env bash
# Builds the real Dockerfile with podman on a Debian base made here from Debian's own packages,
# then runs what the image promises, as its non-root user:
#   1. debootstrap --variant=minbase bookworm from this machine's own Debian mirror (the first
#      http(s) entry for Debian's main archive in its apt sources, or --mirror URL; once,
#      --fresh makes a new one)
#   2. podman import of that root as localhost/hvd_cifar-base:bookworm (the PATH and CMD that
#      Debian's official images set; nothing else added)
#   3. podman build of the Dockerfile on it (--build-arg BASE_IMAGE=that image), from a
#      `git archive` of HEAD, so the image is a commit's, not a working tree's in mid-edit
#   4. the demo: podman run --rm IMAGE (the image's CMD, as user trainer)
#   5. a 2-container job: two containers on podman's bridge network (each its own network
#      namespace and address), sshd on port 2222 in each as trainer (docker/sshd.sh, one key pair
#      mounted at ~/.ssh, as docs/DOCKER.md's multi-node recipe says), then launch/horovodrun.sh
#      -np 2 -p 2222 from the first across both, under MPI and under Gloo
# Prints build time, image size, the demo's accuracy and time and the job's results, and writes
# them to $WORK/results.md. Needs root (debootstrap, rootful podman) and Debian's podman, runc
# and debootstrap (installed when missing).
#
#   scripts/check-image.sh                # WORK=~/.cache/hvd_cifar/image (outside the repository)
#   scripts/check-image.sh --fresh        # new debootstrap root, podman build --no-cache
#   scripts/check-image.sh --mirror URL   # debootstrap from URL instead of the apt sources' mirror
#   scripts/check-image.sh --print-mirror # print the mirror it would use and exit (no root needed)
#   scripts/check-image.sh --gpu          # the GPU image (HOROVOD_GPU_OPERATIONS=NCCL): Horovod built
#                                         # with NCCL, then steps 4 and 5 on this machine's CPUs
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${HVD_CIFAR_IMAGE_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_cifar/image}"
SUITE=bookworm
BASE=localhost/hvd_cifar-base:$SUITE
IMAGE=localhost/hvd_cifar:check
GPU_ARGS=()
PORT=2222
APT_DIR="${HVD_CIFAR_APT_DIR:-/etc/apt}"   # another folder only to test the parsing below

# The first http(s) source of Debian's main archive in the machine's apt sources: one-line
# entries (sources.list, sources.list.d/*.list: "deb [options] URI SUITE COMPONENTS...") and
# deb822 stanzas (sources.list.d/*.sources: Types/URIs/Suites, Enabled: no skipped), read in
# apt's order. "Debian's main archive" = a suite that is a Debian release (a codename or
# stable/testing/...), not its -security, -updates or -backports side archive, so an Ubuntu
# or third-party source is never taken.
apt_debian_mirror() {
  local dir="$1" files=() f
  [ -f "$dir/sources.list" ] && files+=("$dir/sources.list")
  for f in "$dir"/sources.list.d/*; do          # the glob sorts; apt takes both kinds in that order
    case "$f" in *.list | *.sources) [ -f "$f" ] && files+=("$f") ;; esac
  done
  ((${#files[@]})) || return 1
  printf '%s\n' "${files[@]}" | awk '
    BEGIN { split("buster bullseye bookworm trixie forky duke sid oldoldstable oldstable stable testing unstable", r, " ")
            for (i in r) release[r[i]] = 1 }
    function take(types, uris, suites,   t, u, s, nt, nu, ns, i, j, k) {
      nt = split(types, t, /[ \t]+/); nu = split(uris, u, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
      for (i = 1; i <= nt; i++) if (t[i] == "deb")
        for (j = 1; j <= nu; j++) if (u[j] ~ /^https?:\/\//)
          for (k = 1; k <= ns; k++) if (s[k] in release) { sub(/\/+$/, "", u[j]); print u[j]; exit 0 }
    }
    { file = $0
      if (file ~ /\.sources$/) {
        stanza = ""
        while ((getline line < file) > 0) {
          if (line ~ /^[ \t]*#/) continue
          if (line ~ /^[ \t]*$/) { deb822(stanza); stanza = ""; continue }
          stanza = stanza "\n" line
        }
        deb822(stanza)
      } else {
        while ((getline line < file) > 0) {
          sub(/#.*/, "", line)
          n = split(line, w, /[ \t]+/); if (w[1] == "") { for (i = 1; i < n; i++) w[i] = w[i + 1]; n-- }
          if (n < 3) continue
          i = 2
          if (w[2] ~ /^\[/) { while (i <= n && w[i] !~ /\]$/) i++; i++ }
          if (i + 1 <= n) take(w[1], w[i], w[i + 1])
        }
      }
      close(file)
    }
    function deb822(text,   lines, n, i, key, val, f, enabled) {
      if (text == "") return
      n = split(text, lines, "\n"); delete f; key = ""
      for (i = 1; i <= n; i++) {
        if (lines[i] ~ /^[ \t]/ && key != "") { f[key] = f[key] " " lines[i]; continue }
        if (match(lines[i], /^[A-Za-z0-9-]+:/)) {
          key = tolower(substr(lines[i], 1, RLENGTH - 1)); val = substr(lines[i], RLENGTH + 1)
          f[key] = val
        }
      }
      for (key in f) { gsub(/^[ \t]+|[ \t]+$/, "", f[key]) }
      enabled = ("enabled" in f) ? tolower(f["enabled"]) : "yes"
      if (enabled == "no" || enabled == "false") return
      take(f["types"], f["uris"], f["suites"])
    }'
}

fresh=0
print_mirror=0
MIRROR=""
while (($#)); do
  case "$1" in
    --fresh) fresh=1 ;;
    --print-mirror) print_mirror=1 ;;
    --gpu) IMAGE=localhost/hvd_cifar:check-gpu; GPU_ARGS=(--build-arg HOROVOD_GPU_OPERATIONS=NCCL) ;;
    --mirror) [ $# -ge 2 ] || { echo "check-image.sh: --mirror needs a URL" >&2; exit 2; }; MIRROR="$2"; shift ;;
    --mirror=*) MIRROR="${1#--mirror=}" ;;
    *) echo "check-image.sh: unknown argument $1 (takes --fresh, --gpu, --mirror URL, --print-mirror)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$MIRROR" ]; then
  MIRROR="$(apt_debian_mirror "$APT_DIR")" || MIRROR=""
  [ -n "$MIRROR" ] || { echo "check-image.sh: no Debian mirror: $APT_DIR/sources.list{,.d/*.list,.d/*.sources} has no http(s) entry for Debian's main archive; give one with --mirror URL" >&2; exit 2; }
fi
((print_mirror)) && { echo "$MIRROR"; exit 0; }
[ "$(id -u)" -eq 0 ] || { echo "check-image.sh: needs root (debootstrap, rootful podman)" >&2; exit 2; }

log() { printf '[check-image] %s\n' "$*"; }
results=()
result() { results+=("$1"); log "$1"; }

missing=()
for pkg in podman runc debootstrap; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# What this sandbox needs from podman (each seen failing without it, with podman 4.3.1):
# * runc, not Debian's default runtime crun 1.8.1, which refuses the kernel's cgroup layout
#   (v1 controllers beside a cgroup2 mount at /sys/fs/cgroup/unified that has hugetlb enabled):
#   "crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2".
# * resource limits no higher than the ones podman's processes already have: podman asks for
#   RLIMIT_NOFILE 1048576, and raising a hard limit needs CAP_SYS_RESOURCE, which this sandbox
#   does not grant (CapEff lacks bit 24): "crun: setrlimit `RLIMIT_NOFILE`: Operation not
#   permitted", with runc "error setting rlimit type 7" (then type 6, RLIMIT_NPROC, whose hard
#   limit under conmon is 32768 here, below the shell's). --ulimit host fails the same way.
nofile="$(ulimit -Hn)"; nproc="$(ulimit -Hu)"
if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
PODMAN=(podman --runtime runc)
LIMITS=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
# This machine reaches PyPI through a proxy that re-signs TLS with its own CA, which the host
# trusts through /usr/local/share/ca-certificates. Mounting that folder (read-only, build steps
# only) lets the image's ca-certificates, installed by scripts/install.sh, include those CAs;
# on a machine without such a proxy the folder holds nothing and changes nothing.
CA_MOUNT=()
[ -d /usr/local/share/ca-certificates ] &&
  CA_MOUNT=(--volume /usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro)

mkdir -p "$WORK"
rootfs="$WORK/rootfs-$SUITE"

# --- 1. a Debian root file system from Debian's packages ------------------------------------
if ((fresh)) || [ ! -f "$rootfs/.debootstrap-complete" ]; then
  rm -rf "$rootfs"
  log "debootstrap --variant=minbase $SUITE from $MIRROR"
  start=$SECONDS
  debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" > "$WORK/debootstrap.log" 2>&1
  rm -f "$rootfs"/var/cache/apt/archives/*.deb
  touch "$rootfs/.debootstrap-complete"
  result "debootstrap: $((SECONDS - start)) s, $(du -sh --exclude=proc --exclude=sys "$rootfs" | cut -f1)"
fi

# --- 2. import it as the base image -----------------------------------------------------------
start=$SECONDS
tar --exclude=./.debootstrap-complete -C "$rootfs" -c . |
  podman import --quiet --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$BASE" > /dev/null
result "base image $BASE: imported in $((SECONDS - start)) s, $(podman image inspect --format '{{.Size}}' "$BASE") bytes"

# --- 3. build the Dockerfile -------------------------------------------------------------------
context="$WORK/context"
rm -rf "$context" && mkdir -p "$context"
git -C "$ROOT" archive --format=tar HEAD | tar -x -C "$context"
commit="$(git -C "$ROOT" rev-parse --short HEAD)"
no_cache=(); ((fresh)) && no_cache=(--no-cache)
log "podman build of the Dockerfile at $commit (log: $WORK/build.log)"
start=$SECONDS
if ! nice -n 10 "${PODMAN[@]}" build "${no_cache[@]}" "${LIMITS[@]}" ${CA_MOUNT[@]+"${CA_MOUNT[@]}"} \
     ${GPU_ARGS[@]+"${GPU_ARGS[@]}"} --format docker --build-arg "BASE_IMAGE=$BASE" -t "$IMAGE" "$context" \
     > "$WORK/build.log" 2>&1; then
  tail -n 30 "$WORK/build.log" >&2
  echo "check-image.sh: podman build failed (log: $WORK/build.log)" >&2
  exit 1
fi
build_s=$((SECONDS - start))
size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
result "image $IMAGE (commit $commit): built in $build_s s ($((build_s / 60)) min $((build_s % 60)) s), $size bytes ($((size / 1000000)) MB)"

run() { nice -n 10 "${PODMAN[@]}" run "${LIMITS[@]}" "$@"; }
user="$(run --rm "$IMAGE" id -un)"
result "the image runs as: $user"
result "its Horovod: $(run --rm "$IMAGE" horovodrun --check-build | sed -n 's/^ *\[X\] *//p' | paste -sd, | sed 's/,/, /g')"

# --- 4. the demo ------------------------------------------------------------------------------
demo_logs="$WORK/demo-logs"
rm -rf "$demo_logs" && mkdir -p "$demo_logs" && chown 1000:1000 "$demo_logs"
log "demo: podman run --rm $IMAGE (its CMD; log: $WORK/demo.log)"
start=$SECONDS
run --rm -v "$demo_logs:/opt/hvd_cifar/logs" "$IMAGE" > "$WORK/demo.log" 2>&1 ||
  { tail -n 30 "$WORK/demo.log" >&2; echo "check-image.sh: the demo failed" >&2; exit 1; }
demo_s=$((SECONDS - start))
eval_json="$(ls -d "$demo_logs"/*/eval.json | head -n 1)"
demo_acc="$(python3 -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["test_acc"])' "$eval_json")"
result "demo (configs/demo.yaml, 2 ranks, horovodrun in one container): test accuracy $demo_acc, $demo_s s"

# --- 5. a 2-container job over ssh ---------------------------------------------------------------
keys="$WORK/cluster-ssh"
job_logs="$WORK/job-logs"
rm -rf "$keys" "$job_logs" && mkdir -p "$keys" "$job_logs"
ssh-keygen -q -t ed25519 -N "" -C hvd_cifar-check -f "$keys/id_ed25519"
cp "$keys/id_ed25519.pub" "$keys/authorized_keys"
# The containers' addresses are new each run: no known_hosts to keep.
printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' > "$keys/config"
chmod 700 "$keys" && chmod 600 "$keys"/* && chown -R 1000:1000 "$keys" "$job_logs"
containers=(hvd-check-a hvd-check-b)
cleanup() { podman rm -f "${containers[@]}" > /dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
addresses=()
for name in "${containers[@]}"; do
  run -d --name "$name" --hostname "$name" -v "$keys:/home/trainer/.ssh" -v "$job_logs:/opt/hvd_cifar/logs" \
    "$IMAGE" docker/sshd.sh "$PORT" > /dev/null
  addresses+=("$(podman inspect --format '{{.NetworkSettings.IPAddress}}' "$name")")
done
printf '%s slots=1\n' "${addresses[@]}" > "$job_logs/hosts"
sleep 2
for controller in mpi gloo; do
  log "2-container job under $controller: ${addresses[*]} (log: $WORK/job-$controller.log)"
  start=$SECONDS
  if podman exec "${containers[0]}" launch/horovodrun.sh -np 2 -hostfile logs/hosts -p "$PORT" "--$controller" \
       --config configs/tiny.yaml --epochs 3 --max-steps-per-epoch 0 --run-name "job-$controller" \
       > "$WORK/job-$controller.log" 2>&1; then
    summary="$(python3 - "$job_logs/job-$controller" <<'PYEOF'
import json, os, sys
meta = json.load(open(os.path.join(sys.argv[1], "meta.json")))
evaluation = json.load(open(os.path.join(sys.argv[1], "eval.json")))
print(f"hosts {','.join(meta['hostnames'])}, world size {meta['world_size']}, launcher {meta['launcher']!r}, "
      f"test accuracy {evaluation['test_acc']:.4f}, ranks' parameters identical: "
      f"{evaluation['parameters_identical_across_ranks']}")
PYEOF
)"
    result "2-container job ($controller, configs/tiny.yaml 3 epochs): $summary, $((SECONDS - start)) s"
  else
    tail -n 20 "$WORK/job-$controller.log" >&2
    result "2-container job ($controller): FAILED (log: $WORK/job-$controller.log)"
  fi
done

printf '%s\n' "# scripts/check-image.sh, $(date -u +%Y-%m-%dT%H:%MZ)" "${results[@]/#/- }" > "$WORK/results.md"
log "results in $WORK/results.md"
