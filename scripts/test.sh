#!/usr/bin/env bash
# Builds Strata and runs its whole test suite with CTest (the README's test command).
# STRATA_SANITIZE=1 runs it under ASan+UBSan instead.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(bash scripts/build.sh | tail -n 1)
# Full unwinding, so that leak suppressions can see through unloaded plugins.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:fast_unwind_on_malloc=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# Third-party libraries (hwloc plugins, Open MPI) keep allocations to process exit.
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}"
# OpenMPI refuses root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Under the sanitizers (5-10x slower) the longest tests are left out: they repeat code
# paths shorter tests cover there (4 ranks where gpt.mpi.np2 and engine.mpi.np2 run 2;
# 100x-budget training; 200 steps; the matmul peak measurement; the speculative
# optimizer's bf16 GPT cases, whose code paths engine.mpi.np2 runs in bf16 and
# test_speculative's fp32 cases run at every stage), and run in the ordinary build. This
# keeps CI well under 30 minutes.
exclude=()
if [[ "${STRATA_SANITIZE:-0}" == 1 ]]; then
  # (Parameterised tests' names go on with their parameter, so that pattern is unanchored.)
  exclude=(-E '^(gpt\.mpi\.np4|engine\.mpi\.np4|Train\.StatesHundredTimesTheDeviceBudgetAndFourTimesPinnedTrain|Train\.Bf16FollowsTheFp32LossCurveFor200StepsOnText|Plan\.TheCpuPresetIsMeasuredAndPlansTheCpuBackend)$|^StagesAndPrecisions/Speculative\.BitIdenticalToThePlainStepInEveryRegime/Stage[123]bf16')
fi
if ! ctest --test-dir "$dir" --output-on-failure -j2 --timeout 600 "${exclude[@]}"; then
  # The failures' own output again, last, where a truncated CI log still shows it; CI
  # stays red whether or not they pass this time (a pass here means a flaky test).
  echo "== the failed tests once more, alone, with their output"
  ctest --test-dir "$dir" --rerun-failed --output-on-failure --timeout 600 || true
  exit 1
fi
