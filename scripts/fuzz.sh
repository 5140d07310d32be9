#!/usr/bin/env bash
# libFuzzer over every parser of outside bytes (tests/fuzz/README.md). Builds build-fuzz
# with clang (ASan, UBSan, coverage), then fuzzes each target for --seconds from a copy of
# its committed corpus (tests/fuzz/corpus/<target>) plus earlier findings
# (tests/fuzz/regressions/<target>), two targets at a time.
#
#   scripts/fuzz.sh                       # CI: 20 s per target
#   scripts/fuzz.sh --seconds 300 --merge # nightly: 5 min each; inputs that reach new
#                                         # code are merged into the committed corpus
#   scripts/fuzz.sh --seconds 60 manifest # one target
#
# A finding (crash, sanitizer report, leak, an exception other than strata::Error,
# timeout): its input is kept in build-fuzz/findings/<target>/, the log is printed, and
# the script exits 1. Fix the cause, then copy the input to tests/fuzz/regressions/<target>/:
# ctest's fuzz.<target>.corpus replays it from then on in every build.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=20
merge=0
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --merge) merge=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (--seconds N, --merge, target names)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(config set manifest safetensors tokens bytes)
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: no target '$t' (${all[*]})" >&2; exit 2; }
done
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found: apt-get install clang libclang-rt-14-dev" >&2; exit 2; }

dir=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DSTRATA_FUZZ=ON -DSTRATA_TESTS=OFF -DSTRATA_CUDA=OFF \
  -DSTRATA_PYTHON_MODULE=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g" >&2
cmake --build "$dir" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >&2

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}"
run() {  # target: fuzz it; prints one summary line; returns libFuzzer's status
  local t=$1 work="$dir/work/$1" found="$dir/findings/$1"
  rm -rf "$work"; mkdir -p "$work" "$found"
  cp tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  local rc=0
  local seeds=("$work"); [[ -d tests/fuzz/regressions/$t ]] && seeds+=(tests/fuzz/regressions/"$t")
  "$dir/tests/fuzz/fuzz_$t" "${seeds[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=4096 -max_len=65536 -artifact_prefix="$found/" -print_final_stats=1 >"$dir/fuzz_$t.log" 2>&1 || rc=$?
  if ((rc)); then
    echo "fuzz_$t: FINDING (exit $rc); input in $found/, log $dir/fuzz_$t.log:"
    tail -n 40 "$dir/fuzz_$t.log"
    return 1
  fi
  echo "fuzz_$t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$dir/fuzz_$t.log" | grep -o '[0-9]*$') runs in ${seconds} s," \
       "coverage $(grep -o 'cov: [0-9]*' "$dir/fuzz_$t.log" | tail -n1 | grep -o '[0-9]*') edges, no finding"
  if ((merge)); then
    mkdir -p tests/fuzz/corpus/"$t"
    "$dir/tests/fuzz/fuzz_$t" -merge=1 -max_len=65536 tests/fuzz/corpus/"$t" "$work" >>"$dir/fuzz_$t.log" 2>&1
  fi
}
status=0
pids=()
for t in "${targets[@]}"; do
  run "$t" &
  pids+=($!)
  if ((${#pids[@]} >= 2)); then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
