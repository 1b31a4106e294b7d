#!/usr/bin/env bash
# Proves hvd_cifar end to end on each Python it supports: for each version, scripts/install.sh
# with PYTHON=python3.X (venv .venv for 3.11, .venv-3.X for the others; the first run downloads
# torch and builds horovod, minutes), `horovodrun --check-build`, then a 2-rank training of
# configs/tiny.yaml's small CNN on digits for 3 whole epochs through launch/horovodrun.sh under
# MPI and under Gloo. Each run must say it ran on that Python with 2 ranks under that controller
# (meta.json) and end with the same parameters on both ranks and a test accuracy of at least
# MIN_ACC (eval.json; chance is 0.10). Prints one markdown table row per version, the columns of
# docs/INSTALL.md's table; each run's accuracy and seconds go to OUT/NAME.result beside its log.
# The status is 0 only when every version passed.
#
#   scripts/check-pythons.sh                 # 3.11 3.12 3.13
#   scripts/check-pythons.sh 3.12            # one version
#   CHECK_PYTHONS_LOG_DIR=/tmp/x scripts/check-pythons.sh 3.11   # run folders and logs there
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
versions=("$@")
((${#versions[@]})) || versions=(3.11 3.12 3.13)
out="${CHECK_PYTHONS_LOG_DIR:-$ROOT/logs/check-pythons}"
MIN_ACC=0.85
TRAIN_FLAGS=(--config configs/tiny.yaml --epochs 3 --max-steps-per-epoch 0)
mkdir -p "$out"

# Checks one run folder against what was asked; prints "acc ok" or a reason and fails.
check_run() {  # PY RUN_DIR VERSION CONTROLLER
  "$1" - "$2" "$3" "$4" "$MIN_ACC" <<'PYEOF'
import json, os, sys
run_dir, version, controller, min_acc = sys.argv[1:]
try:
    meta = json.load(open(os.path.join(run_dir, "meta.json")))
    evaluation = json.load(open(os.path.join(run_dir, "eval.json")))
except OSError as err:
    sys.exit(f"no run folder files ({err.strerror}: {err.filename})")
launcher = {"mpi": "mpi", "gloo": "horovodrun-gloo"}[controller]
problems = []
if not meta["python"].startswith(version + "."):
    problems.append(f"ran on Python {meta['python']}")
if meta["world_size"] != 2:
    problems.append(f"world size {meta['world_size']}")
if not meta["launcher"].startswith(launcher):
    problems.append(f"launcher {meta['launcher']!r}")
if not evaluation.get("parameters_identical_across_ranks"):
    problems.append("ranks' parameters differ")
if evaluation["test_acc"] < float(min_acc):
    problems.append(f"test accuracy {evaluation['test_acc']:.3f} < {min_acc}")
if problems:
    sys.exit("; ".join(problems))
print(f"{evaluation['test_acc']:.3f}")
PYEOF
}

failed=0
printf '| Python | venv | horovod build | MPI, 2 ranks | Gloo, 2 ranks |\n'
printf '|---|---|---|---|---|\n'
for version in "${versions[@]}"; do
  log="$out/install-$version.log"
  if ! PYTHON="python$version" bash scripts/install.sh > "$log" 2>&1; then
    printf '| %s | - | FAIL: install.sh (%s) | | |\n' "$version" "$(tail -n 1 "$log")"
    failed=1; continue
  fi
  venv="$(sed -n 's/^\[install\] ready: //p' "$log" | tail -n 1)"
  py="$venv/bin/python"
  full_version="$("$py" -c 'import platform; print(platform.python_version())')"
  if "$venv/bin/horovodrun" --check-build > "$out/check-build-$version.log" 2>&1 &&
     grep -q '\[X\] PyTorch' "$out/check-build-$version.log" && grep -q '\[X\] MPI' "$out/check-build-$version.log" &&
     grep -q '\[X\] Gloo' "$out/check-build-$version.log"; then
    build="PyTorch, MPI, Gloo"
  else
    build="FAIL"; failed=1
  fi
  cells=()
  for controller in mpi gloo; do
    name="py$version-$controller"
    rm -rf "${out:?}/$name"
    start=$SECONDS
    if PYTHON="$py" launch/horovodrun.sh -np 2 "--$controller" "${TRAIN_FLAGS[@]}" \
         --log-dir "$out" --run-name "$name" > "$out/$name.log" 2>&1 &&
       result="$(check_run "$py" "$out/$name" "$version" "$controller" 2>&1)"; then
      printf 'test acc %s, %s s\n' "$result" "$((SECONDS - start))" > "$out/$name.result"
      cells+=("every check passed")
    else
      cells+=("FAIL: ${result:-launch failed, see $name.log}")
      failed=1
    fi
    result=""
  done
  printf '| %s | %s | %s | %s | %s |\n' "$full_version" "${venv#"$ROOT"/}" "$build" "${cells[0]}" "${cells[1]}"
done
exit "$failed"
