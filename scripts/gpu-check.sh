#!/usr/bin/env bash
# Runs on a lent GPU machine, in a copy of the repository with gpu/bundle.tar.xz beside it
# (scripts/gpu-bundle.sh makes it here): unpacks the binaries, finds CUDA's libraries and
# NCCL on that machine (its toolkit, or the nvidia-* wheels of its PyTorch), then runs
# what is asked, each part under a time limit, its output in $OUT (or ./gpu/out):
#   tests      every GPU test (gtest filters below), one log
#   sanitize   compute-sanitizer memcheck and racecheck over the 16-bit and Llama model tests
#   train      strata train on the fortunes corpus, fp32, bf16, bf16 speculative
#   bench      strata bench step --backend cuda, 124M, fp32 and bf16: CPU Adam plain and speculative, the
#              GPU optimizer, offload_optimizer.ratio 0.5 plain and speculative, NVMe; PyTorch beside
#   bench1b    the same in memory, bf16 alone, for a 1.1B GPT
#   kernels    strata.cuda_kernels: test_gpt_cuda with the reference and the fused kernels each alone,
#              compute-sanitizer memcheck and racecheck over the fused path, and the 1.1B bf16 step in
#              memory with reference, then fused kernels, PyTorch beside; within 8 minutes
#   fusedtest  test_gpt_cuda with the fused kernels alone (the first part of kernels), about a minute
#   fusedsan   compute-sanitizer memcheck and racecheck over the fused path (kernels' second part)
#   step1b     the 1.1B bf16 step (bench1b's shape) with the GPU optimizer, CPU Adam over pinned states
#              and the split 0.5: fused kernels alone, then the reference kernels with PyTorch and FSDP2
#              CPUOffloadPolicy beside them (--peers fsdp2); about 4 minutes; wants the H200's memory
#   attn       STRATA_ATTENTION=mma (the tensor-core attention, attention_mma_kernels.hpp): test_gpt_cuda's mma
#              tests and column_sums_rows', compute-sanitizer memcheck and racecheck over them, then the
#              1.1B bf16 step (fused kernels, the GPU optimizer) with mma and then with gemm, PyTorch
#              beside; within 8 minutes
#   lane       the speculative optimizer on its lane against in line: 124M in memory
#   copy       strata bench copy --backend cuda: pinned <-> device through the copy stream, beside cudaMemcpy
#   torch      strata.torch on the cuda backend with the machine's torch, transformers and peft:
#              python/tests/test_torch*.py with STRATA_TEST_BACKEND=cuda (the references on the GPU)
#   lora7b     a LoRA step on Llama-2-7B's shape (random weights, r 16 on q/v, 2048 tokens, checkpointing):
#              Strata with the base pinned, peft on plain PyTorch, FSDP2 with CPUOffloadPolicy (bench/ref/lora_step.py)
#   peers      strata bench step --backend cuda --peers deepspeed,fsdp2: 124M bf16, Strata beside DeepSpeed
#              ZeRO-Offload, ZeRO-Infinity (NVMe) and FSDP2 with CPUOffloadPolicy, within 8 minutes; the
#              peers run with $STRATA_PEER_PYTHON (default python3), DeepSpeed from gpu/whl (gpu-bundle.sh;
#              carry gpu/, not just the bundle), and one it cannot start is skipped
#              with its reason in the table's notes
#   rankshang  why 2 ranks on one GPU hung: the cuda stream's wait for host events (Device.*, and the
#              hardware-queue checks at CUDA_DEVICE_MAX_CONNECTIONS=8, the GPU-side wait expected to
#              fail, and at 1, the staged communicator's host-waited events expected to pass), then
#              strata train at world 2 (stage 1, offload none, staged: its events waited for on the
#              host) with cuda-gdb's backtraces of every thread of each rank 25 s in (bt-RANKPID.txt)
#              if it still runs then, then world 2 once more with STRATA_CUDA_HOST_EVENT_WAIT=host
#              (every host event waited for by the issuing thread, not the GPU), within 4 minutes
#   events     the cuda model handing buffers back with CUDA events (2026-11-28), the engine and NCCL
#              waiting for them on the GPU: strata train on cuda against the cpu backend (Train.Cuda*:
#              stages 2 and 3, NVMe and pinned, parts and tiles, checkpoints off the device, Llama, the
#              speculative and the GPU optimizer) and NCCL's tests, within 8 minutes
#   attnrace   compute-sanitizer racecheck over every GptCudaMma test, one at a time, within 3 minutes
#   ranks      2 and 4 ranks on the one GPU (mpirun, strata.device_communicator "staged"): strata train,
#              every stage, offload none/cpu/nvme, bf16, losses against world 1, a table in ranks.md, within
#              8 minutes (scripts/gpu-ranks.sh); mpirun is the bundle's Open MPI, else the machine's
#   profile    where the 1.1B bf16 step's GPU time goes (bench1b's shape, fused kernels, the GPU optimizer):
#              ncu times every kernel of one step of Strata and one of PyTorch (bench step --cuda-profile
#              brackets their warm-up steps in CUDA's profiler capture), serialised; kernel-times.py sums
#              them by kernel into $OUT/kernel-times.md (ncu.csv beside it), within 7 minutes
#   capacity   the largest GPT that trains (2 steps, the loss falling) with Strata (params on the GPU,
#              optimizer states in pinned memory: its largest plan), FSDP2 with CPUOffloadPolicy and
#              DeepSpeed ZeRO-Infinity (NVMe), each searched by bench/capacity_search.py along strata
#              plan --largest's ladder (gpt-6.7b's width, 4 layers a rung, seq 1024), within 8 minutes:
#              the plan's predictions (gpt and llama, seconds), then Strata 160 s, FSDP2 145 s and
#              DeepSpeed 125 s of search (a search cut by its budget reports a bound); tables in
#              $OUT/capacity-*.md and .json. DeepSpeed builds its ops on first use: run after peers
#              on a warm machine
# Usage: bash scripts/gpu-check.sh PART... (default: tests)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
known=(tests sanitize train bench bench1b kernels fusedtest fusedsan step1b attn events attnrace lane copy peers torch lora7b
       ranks rankshang profile capacity)
# The parts asked for are checked before anything is unpacked or run: a typo costs
# nothing of the machine's time.
for part in "$@"; do
  case $part in
  -h | --help) sed -n '2,/^# Usage/s/^# \{0,1\}//p' "$0"; exit 0 ;;
  esac
  [[ " ${known[*]} " == *" $part "* ]] ||
    { echo "gpu-check.sh: unknown part '$part' (${known[*]})" >&2; exit 2; }
done
out=${OUT:-$root/gpu/out}
mkdir -p "$out"
g=/tmp/strata-gpu
rm -rf "$g" && mkdir -p "$g" && xz -dc gpu/bundle.tar.xz | tar -C "$g" -xf - || { echo "gpu-check.sh: cannot unpack gpu/bundle.tar.xz" >&2; exit 2; }
# The binaries name files by the absolute paths of the tree they were built in (the
# PyTorch reference script, for one): point that path at this copy when it is free.
built=$(strings "$g/bin/strata" | grep -m1 -o '/[^ "]*/bench/ref/torch_gpt_step.py' | sed 's#/bench/ref/torch_gpt_step.py##')
if [[ -n $built && ! -e $built ]]; then mkdir -p "$(dirname "$built")" && ln -s "$root" "$built"; fi
libdirs=$g/lib
for pat in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  f=$( (ldconfig -p | awk -v p="$pat" '$1 == p {print $NF}'; find /usr/local/cuda*/ /opt /usr/lib -name "$pat" 2>/dev/null) | head -1)
  [[ -n $f ]] || { echo "gpu-check.sh: $pat is not on this machine" >&2; exit 2; }
  libdirs+=:$(dirname "$f")
done
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=$g/bin
# DeepSpeed and the packages it needs that the machine lacks (gpu-bundle.sh's gpu/whl), for the peers:
# installed into a folder of their own, first on PYTHONPATH.
if compgen -G "gpu/whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$g/site" gpu/whl/*.whl &&
    export PYTHONPATH=$g/site${PYTHONPATH:+:$PYTHONPATH} ||
    echo "gpu-check.sh: could not install gpu/whl's wheels: the peers run without DeepSpeed" >&2
fi
# libaio for DeepSpeed's async_io op (ZeRO-Infinity), where the machine has no headers: gcc finds
# the unpacked copy through CPATH and LIBRARY_PATH (DeepSpeed's check and its build), the op
# through LD_LIBRARY_PATH.
if [[ ! -e /usr/include/libaio.h ]] && compgen -G "gpu/whl/aio/*.deb" > /dev/null; then
  for f in gpu/whl/aio/*.deb; do dpkg -x "$f" "$g/aio"; done
  a=$g/aio/usr/lib/x86_64-linux-gnu
  export CPATH=$g/aio/usr/include${CPATH:+:$CPATH} LIBRARY_PATH=$a${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$a
fi
missing=$(ldd "$B"/* | grep "not found" | sort -u)
[[ -z $missing ]] || { echo "gpu-check.sh: libraries missing: $missing" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/machine.txt"
nproc >> "$out/machine.txt"; (. /etc/os-release; echo "$PRETTY_NAME") >> "$out/machine.txt"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$out/machine.txt"

run() {  # run LOG LIMIT CMD...: appends to $out/LOG, says the exit status
  local log=$1 limit=$2; shift 2
  echo "=== $* (limit ${limit}s)" | tee -a "$out/$log"
  local t0=$SECONDS
  timeout "$limit" "$@" >> "$out/$log" 2>&1
  local rc=$?
  echo "=== exit $rc after $((SECONDS - t0))s: $*" | tee -a "$out/$log"
  return 0
}

parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(tests)
for part in "${parts[@]}"; do
  case $part in
  tests)
    run tests.log 60 "$B/test_core" --gtest_filter='Device.*'
    run tests.log 120 "$B/test_collectives_nccl"
    run tests.log 300 "$B/test_gpt_cuda"
    run tests.log 120 "$B/test_capi_cuda"
    run tests.log 400 "$B/test_train" --gtest_filter='Train.Cuda*'
    run tests.log 120 "$B/test_cpu_adam" --gtest_filter='StreamAdamStep.*'
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^=== exit|worst relative|^measured|Failure|Expected|Which is" "$out/tests.log" | head -150
    ;;
  sanitize)
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    run sanitize.log 240 "$cs" --tool memcheck --error-exitcode 9 "$B/test_gpt_cuda" --gtest_filter='*Bf16*:*Fp16*:*Llama*'
    run sanitize.log 150 "$cs" --tool racecheck --error-exitcode 9 "$B/test_gpt_cuda" \
      --gtest_filter='Checkpointing/GptCudaBf16VsCpu.*/None:GptCudaFp16VsCpu.*'
    grep -E "ERROR SUMMARY|^=== exit|FAILED" "$out/sanitize.log"
    ;;
  train)
    mkdir -p data && cp -n "$g/data/fortunes.txt" data/ 2>/dev/null
    for set in "" "--set bf16.enabled=true" "--set bf16.enabled=true --set strata.speculative_optimizer=true"; do
      d=$(mktemp -d /tmp/strata-train-XXXX)
      # shellcheck disable=SC2086
      run train.log 200 "$B/strata" train --config configs/fortunes.json --set strata.backend=cuda \
        --set strata.steps=200 --set strata.checkpoint_dir="$d/ckpt" --set zero_optimization.offload_param.nvme_path="$d" \
        --set zero_optimization.offload_optimizer.nvme_path="$d" --eval-batches 8 $set
      rm -rf "$d"
    done
    grep -E "^=== exit|held-out|step +200|speculation" "$out/train.log"
    ;;
  bench)
    # 124M, 4096 tokens per step, fp32 and bf16: CPU Adam over pinned states (offload_optimizer.ratio 1),
    # plain and speculative (overlapped with backward), the split 0.5, plain and speculative, the GPU
    # optimizer (ratio 0), params and optimizer on NVMe; PyTorch beside.
    d=$(mktemp -d /tmp/strata-bench-XXXX)
    run bench.log 400 "$B/strata" bench step --backend cuda --dir "$d" --reps 3 --warmup 1 --python "$(command -v python3)" \
      --precision bf16 --speculative --gpu-optimizer --optimizer-ratio 0.5 --json "$out/bench-124m.json"
    rm -rf "$d"
    tail -n 40 "$out/bench.log"
    ;;
  bench1b)
    # A 1.1B GPT (20 x 2048, GPT-2's vocabulary), bf16 alone, in memory: CPU Adam over pinned states
    # plain and speculative, the split 0.5 plain and speculative, the GPU optimizer, PyTorch beside.
    d=$(mktemp -d /tmp/strata-bench-XXXX)
    run bench1b.log 480 "$B/strata" bench step --backend cuda --dir "$d" --layers 20 --d-model 2048 --heads 16 --seq 1024 \
      --micro-batch 2 --memory-budget 10G --no-nvme --precision bf16 --no-f32 --speculative --gpu-optimizer \
      --optimizer-ratio 0.5 --reps 3 --warmup 1 --python "$(command -v python3)" --json "$out/bench-1b.json"
    rm -rf "$d"
    tail -n 30 "$out/bench1b.log"
    ;;
  kernels)
    # The fused kernels (strata.cuda_kernels = "fused") against the cpu model, then the reference ones alone,
    # with the same tolerances; the sanitizers over the fused path only (the reference one is `sanitize`'s).
    for k in fused reference; do
      run kernels.log 70 env STRATA_TEST_CUDA_KERNELS=$k "$B/test_gpt_cuda"
    done
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    run kernels.log 90 env STRATA_TEST_CUDA_KERNELS=fused "$cs" --tool memcheck --error-exitcode 9 "$B/test_gpt_cuda" \
      --gtest_filter='Checkpointing/GptCudaBf16VsCpu.*/None:GptCudaFp16VsCpu.*:Checkpointing/GptCudaVsCpu.*/PerBlock'
    run kernels.log 50 env STRATA_TEST_CUDA_KERNELS=fused "$cs" --tool racecheck --error-exitcode 9 "$B/test_gpt_cuda" \
      --gtest_filter='Checkpointing/GptCudaBf16VsCpu.*/None'
    # The 1.1B GPT of bench1b, bf16, in memory (CPU Adam over pinned states): reference kernels with PyTorch
    # beside, then the fused ones.
    # Limits: 70 + 70 + 90 + 50 + 100 + 80 s, within 8 minutes.
    d=$(mktemp -d /tmp/strata-bench-XXXX)
    for k in reference fused; do
      torch=(--python "$(command -v python3)") limit=100
      [[ $k == fused ]] && torch=(--no-torch) limit=80
      run kernels.log $limit "$B/strata" bench step --backend cuda --cuda-kernels $k --dir "$d" --layers 20 --d-model 2048 \
        --heads 16 --seq 1024 --micro-batch 2 --memory-budget 10G --no-nvme --precision bf16 --no-f32 --reps 3 \
        --warmup 1 "${torch[@]}" --json "$out/kernels-1b-$k.json"
    done
    rm -rf "$d"
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^=== exit|^measured|ERROR SUMMARY|Failure|^(in memory|torch|PyTorch)" "$out/kernels.log" |
      cut -c1-200 | head -80
    ;;
  fusedtest)
    run kernels.log 70 env STRATA_TEST_CUDA_KERNELS=fused "$B/test_gpt_cuda"
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^=== exit|Failure" "$out/kernels.log" | cut -c1-200 | head -40
    ;;
  fusedsan)
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    run sanitize.log 90 env STRATA_TEST_CUDA_KERNELS=fused "$cs" --tool memcheck --error-exitcode 9 "$B/test_gpt_cuda" \
      --gtest_filter='Checkpointing/GptCudaBf16VsCpu.*/None:GptCudaFp16VsCpu.*:Checkpointing/GptCudaVsCpu.*/PerBlock'
    run sanitize.log 50 env STRATA_TEST_CUDA_KERNELS=fused "$cs" --tool racecheck --error-exitcode 9 "$B/test_gpt_cuda" \
      --gtest_filter='Checkpointing/GptCudaBf16VsCpu.*/None'
    grep -E "ERROR SUMMARY|^=== exit|FAILED" "$out/sanitize.log"
    ;;
  step1b)
    # bench1b's 1.1B shape, bf16, in memory, without the speculative rows: CPU Adam over pinned states,
    # the GPU optimizer and the split 0.5; the fused kernels first (alone), then the reference ones
    # with PyTorch (fused AdamW) and FSDP2 CPUOffloadPolicy beside them. Each run holds three 1.1B
    # engines, the second PyTorch's fp32 states too: about 75 GB of HBM, the H200's.
    d=$(mktemp -d /tmp/strata-bench-XXXX)
    shape=(--backend cuda --dir "$d" --layers 20 --d-model 2048 --heads 16 --seq 1024 --micro-batch 2 --memory-budget 10G
           --no-nvme --precision bf16 --no-f32 --gpu-optimizer --optimizer-ratio 0.5 --reps 3 --warmup 1)
    run step1b.log 100 "$B/strata" bench step "${shape[@]}" --cuda-kernels fused --no-torch --json "$out/step1b-fused.json"
    run step1b.log 150 "$B/strata" bench step "${shape[@]}" --cuda-kernels reference --peers fsdp2 \
      --python "$(command -v python3)" --json "$out/step1b-reference.json"
    rm -rf "$d"
    grep -E "^=== exit|^(in memory|params|optimizer|FSDP2|PyTorch|bf16 tokens|Strata |MFU)|skipped|error" "$out/step1b.log" | cut -c1-220
    ;;
  attn)
    # The tensor-core attention (STRATA_ATTENTION=mma): its tests against the cpu model (bf16 and fp16,
    # head dimensions 16, 64 and 128, GPT-2 and Llama) and the refusals, with the fused set's bias
    # gradients over row chunks (GptCudaKernels: column_sums_rows against the host's sum); the
    # sanitizers over them with the reference kernels alone (the attention is the same under both
    # sets); then the 1.1B bf16 step of bench1b's shape with the fused kernels and the GPU optimizer,
    # mma without PyTorch, then gemm (the default) with PyTorch beside, so the two attentions and
    # PyTorch are timed on one machine.
    # Limits: 70 + 80 + 50 + 100 + 130 s, within 8 minutes.
    run attn.log 70 "$B/test_gpt_cuda" --gtest_filter='GptCudaMma.*:GptCudaSizes.Mma*:GptCudaKernels.*'
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    run attn.log 80 env STRATA_TEST_CUDA_KERNELS=reference "$cs" --tool memcheck --error-exitcode 9 \
      "$B/test_gpt_cuda" --gtest_filter='GptCudaMma.*:GptCudaKernels.*'
    run attn.log 50 env STRATA_TEST_CUDA_KERNELS=reference "$cs" --tool racecheck --error-exitcode 9 \
      "$B/test_gpt_cuda" --gtest_filter='GptCudaMma.Fp16:GptCudaMma.HeadDims:GptCudaKernels.*'
    d=$(mktemp -d /tmp/strata-bench-XXXX)
    shape=(--backend cuda --dir "$d" --layers 20 --d-model 2048 --heads 16 --seq 1024 --micro-batch 2 --memory-budget 10G
           --no-nvme --precision bf16 --no-f32 --gpu-optimizer --reps 3 --warmup 1 --cuda-kernels fused)
    run attn.log 100 env STRATA_ATTENTION=mma "$B/strata" bench step "${shape[@]}" --no-torch --json "$out/attn-1b-mma.json"
    run attn.log 130 env STRATA_ATTENTION=gemm "$B/strata" bench step "${shape[@]}" --python "$(command -v python3)" \
      --json "$out/attn-1b-gemm.json"
    rm -rf "$d"
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^=== exit|^measured|ERROR SUMMARY|Failure|^(in memory|params|optimizer|PyTorch|bf16 tokens|Strata |MFU)|error" \
      "$out/attn.log" | cut -c1-220 | head -80
    ;;
  events)
    # Limits: 400 + 60 s.
    run events.log 400 "$B/test_train" --gtest_filter='Train.Cuda*'
    run events.log 60 "$B/test_collectives_nccl"
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^=== exit|worst relative|Failure|Expected|Which is" "$out/events.log" | head -80
    ;;
  attnrace)
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    for t in Fp16 Bf16 Llama HeadDims; do
      run attn.log 45 env STRATA_TEST_CUDA_KERNELS=reference "$cs" --tool racecheck --error-exitcode 9 \
        "$B/test_gpt_cuda" --gtest_filter="GptCudaMma.$t"
    done
    grep -E "ERROR SUMMARY|^=== exit|FAILED|RACECHECK SUMMARY" "$out/attn.log"
    ;;
  lane)
    # The speculative optimizer on its lane against in line (--speculation-inline), bf16, the
    # 124M in memory (CPU Adam over pinned states), 4096 tokens per step.
    d=$(mktemp -d /tmp/strata-bench-XXXX)
    for how in "" --speculation-inline; do
      # shellcheck disable=SC2086
      run lane.log 150 "$B/strata" bench step --backend cuda --dir "$d" --no-nvme --precision bf16 --speculative $how \
        --no-torch --reps 5 --warmup 1 --json "$out/lane-124m${how:+-inline}.json"
    done
    rm -rf "$d"
    grep -E "^===|^(in memory|params|optimizer)|speculative:" "$out/lane.log" | cut -c1-200
    ;;
  torch)
    if [[ ! -f $g/python/strata/__init__.py ]]; then
      echo "gpu-check.sh torch: the bundle has no Python module (gpu-bundle.sh found no Python 3.12)" | tee -a "$out/torch.log"
    else
      for t in test_torch test_torch_hf test_torch_peft; do
        run torch.log 240 env PYTHONPATH="$g/python:$root/python/tests" STRATA_TEST_BACKEND=cuda PYTHONUNBUFFERED=1 \
          python3 "$root/python/tests/$t.py"
      done
    fi
    ;;
  lora7b)
    if [[ ! -f $g/python/strata/__init__.py ]]; then
      echo "gpu-check.sh lora7b: the bundle has no Python module (gpu-bundle.sh found no Python 3.12)" | tee -a "$out/lora7b.log"
    else
      run lora7b.log 470 env PYTHONPATH="$g/python" PYTHONUNBUFFERED=1 python3 "$root/bench/ref/lora_step.py" \
        --shape llama-2-7b --systems strata-pinned,peft,fsdp2 --steps 2 --seq 2048 --timeout 150 --json "$out/lora7b.json"
    fi
    ;;
  copy)
    run copy.log 120 "$B/strata" bench copy --backend cuda --sizes 1M,16M,256M --reps 5 --json "$out/bench-copy.json"
    tail -n 20 "$out/copy.log"
    ;;
  peers)
    # 124M, bf16 alone, 4096 tokens per step: Strata in memory (CPU Adam over pinned states) and on NVMe,
    # beside DeepSpeed ZeRO-3 with offload_optimizer cpu, with params and optimizer on NVMe (same --dir),
    # and FSDP2 with CPUOffloadPolicy, each in its own process on the GPU (DS_ACCELERATOR=cuda). DeepSpeed
    # builds cpu_adam and async_io with ninja on first use (minutes; async_io needs libaio-dev).
    d=$(mktemp -d /tmp/strata-bench-XXXX)
    DS_ACCELERATOR=cuda run peers.log 480 "$B/strata" bench step --backend cuda --dir "$d" --precision bf16 --no-f32 \
      --peers deepspeed,fsdp2 --python "${STRATA_PEER_PYTHON:-$(command -v python3)}" --reps 3 --warmup 1 \
      --json "$out/bench-peers.json"
    rm -rf "$d"
    tail -n 30 "$out/peers.log"
    ;;
  ranks)
    # Several ranks on one GPU. mpirun: the bundle's Open MPI (gpu-bundle.sh), the version
    # the binaries' libmpi is, with OPAL_PREFIX at its unpacked place; else the machine's.
    mpi=$(command -v mpirun)
    if [[ -x $g/ompi/bin/mpirun ]]; then
      export OPAL_PREFIX=$g/ompi
      mpi=$g/ompi/bin/mpirun
    fi
    if [[ -z $mpi ]]; then
      echo "gpu-check.sh ranks: no mpirun on this machine and none in the bundle" | tee -a "$out/ranks.log"
    else
      MPIRUN=$mpi run ranks.log 480 bash scripts/gpu-ranks.sh "$B/strata" "$out" cuda
      tail -n 25 "$out/ranks.log"
    fi
    ;;
  rankshang)
    # The suspected cause first (cuda_device.cu): with 8 hardware queues (CUDA's default) a stream held
    # by a wait for a host event holds another; expected to fail at 8 and pass at libstrata's 32. The
    # staged communicator's events are waited for on the host, which holds no queue even at 1.
    run devwait.log 60 "$B/test_core" --gtest_filter='Device.*:HostEvent.*'
    run devwait.log 40 env CUDA_DEVICE_MAX_CONNECTIONS=8 "$B/test_core" \
      --gtest_filter='Device.AStreamWaitingForAHostEventHoldsNoOtherStream'
    run devwait.log 40 env CUDA_DEVICE_MAX_CONNECTIONS=1 "$B/test_core" --gtest_filter='Device.AHostWaitedEventHoldsNoQueue'
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|^=== exit|Failure|held another|did not end" "$out/devwait.log"
    mpi=$(command -v mpirun)
    [[ -x $g/ompi/bin/mpirun ]] && export OPAL_PREFIX=$g/ompi && mpi=$g/ompi/bin/mpirun
    gdb=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
    w=$(mktemp -d /tmp/strata-hang-XXXX)
    python3 -c "open('$w/data.txt', 'w').write(' '.join(['the cat sat on a mat'] * 8000))"
    cat > "$w/c.json" <<EOF
{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 1}, "strata": {"backend": "cuda", "device_communicator": "staged", "steps": 4,
 "device_budget": "64MiB", "pinned_budget": "64MiB",
 "model": {"layers": 2, "d_model": 64, "heads": 4, "seq_len": 32, "vocab": 256}, "data": {"path": "$w/data.txt", "format": "text"}}}
EOF
    (cd "$w" && timeout 100 "$mpi" --oversubscribe --allow-run-as-root --bind-to none --mca btl self,vader \
      --mca btl_vader_single_copy_mechanism none -np 2 "$B/strata" train --config c.json --metrics m.jsonl \
      > "$out/rankshang.log" 2>&1) &
    sleep 25
    for p in $(pgrep -x strata); do
      timeout 45 "$gdb" -p "$p" -batch -ex "info threads" -ex "thread apply all bt 25" > "$out/bt-$p.txt" 2>&1 &
    done
    sleep 1 && while pgrep -x cuda-gdb > /dev/null; do sleep 1; done
    pkill -x strata
    wait
    echo "=== world 2 ended; metrics lines: $(wc -l < "$w/m.jsonl" 2>/dev/null)" | tee -a "$out/rankshang.log"
    # Again with the streams' waits for host events done by the issuing thread instead of the GPU
    # (STRATA_CUDA_HOST_EVENT_WAIT=host, cuda_device.cu): a run that ends here and hangs above puts the
    # hang in the GPU-side wait.
    rm -f "$w/m.jsonl"
    (cd "$w" && STRATA_CUDA_HOST_EVENT_WAIT=host timeout 60 "$mpi" --oversubscribe --allow-run-as-root --bind-to none \
      --mca btl self,vader --mca btl_vader_single_copy_mechanism none -x STRATA_CUDA_HOST_EVENT_WAIT -np 2 \
      "$B/strata" train --config c.json --metrics m.jsonl > "$out/rankshang-hostwait.log" 2>&1)
    echo "=== world 2, STRATA_CUDA_HOST_EVENT_WAIT=host, exit $?; metrics lines: $(wc -l < "$w/m.jsonl" 2>/dev/null)" |
      tee -a "$out/rankshang.log"
    rm -rf "$w"
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^=== exit|Failure" "$out/rankshang.log"
    tail -n 15 "$out/rankshang.log" | cut -c1-200
    ;;
  profile)
    # One step of each under Nsight Compute, kernel by kernel (gpu__time_duration.sum, the clocks and caches
    # left alone); outside the capture the kernels run unprofiled. The sum is GPU busy time without overlap.
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    if [[ -z $ncu ]]; then
      echo "gpu-check.sh profile: no ncu on this machine" | tee -a "$out/profile.log"
    else
      d=$(mktemp -d /tmp/strata-prof-XXXX)
      run profile.log 400 "$ncu" --target-processes all --profile-from-start off --clock-control none \
        --cache-control none --metrics gpu__time_duration.sum --csv --log-file "$out/ncu.csv" \
        "$B/strata" bench step --backend cuda --dir "$d" --layers 20 --d-model 2048 --heads 16 --seq 1024 \
        --micro-batch 2 --memory-budget 10G --no-nvme --precision bf16 --no-f32 --gpu-optimizer --reps 1 --warmup 1 \
        --cuda-kernels fused --python "$(command -v python3)" --cuda-profile "params and optimizer on GPU, bf16" \
        --cuda-profile "PyTorch on the GPU, autocast bf16"
      rm -rf "$d"
      python3 scripts/kernel-times.py "$out/ncu.csv" --top 30 --out "$out/kernel-times.md" >> "$out/profile.log" 2>&1
      grep -E "^=== exit|^(params|optimizer|PyTorch|bf16 tokens|MFU)|error|rror" "$out/profile.log" | cut -c1-220 | head -30
      grep -E "^###|^\| " "$out/kernel-times.md" | head -80
    fi
    ;;
  capacity)
    # The ladder: gpt-6.7b's width (d_model 4096, 32 heads, GPT-2's vocabulary), 4 layers a rung (805M
    # parameters), seq 1024, micro-batch 1, bf16. Strata starts at the rung the plan predicts for params
    # on the GPU and optimizer states in pinned memory, FSDP2 at the one for params and optimizer in host
    # memory (CPUOffloadPolicy's split); DeepSpeed at the first rung (4 layers: its NVMe traffic for a 1B
    # model already takes a minute or more), walking up while it passes. Each search stops
    # at its --budget (a trial's limit is cut to what is left), so the part takes about 435 s, the
    # script's set-up about 20 more; the limits of run are the budgets plus 8 s, a guard that should
    # never be reached.
    py=${STRATA_PEER_PYTHON:-$(command -v python3)}
    # Scratch (DeepSpeed's swap files) on the repository's disk, not /tmp, which may be in RAM; which
    # file system it is goes in the log.
    mkdir -p gpu && d=$(mktemp -d "$root/gpu/capacity-XXXX")
    df -h "$d" /tmp >> "$out/capacity.log"
    for fam in gpt llama; do
      for off in none/cpu cpu/cpu nvme/nvme; do
        run capacity.log 30 "$B/strata" plan --largest --model "$([[ $fam == gpt ]] && echo gpt-6.7b || echo llama2-7b)" \
          --cluster h200-1 --seq 1024 --precision bf16 --offload-param "${off%/*}" --offload-optimizer "${off#*/}" \
          --layer-step 1
      done
    done
    search=(bench/capacity_search.py --family gpt --layer-step 4 --seq 1024 --steps 2 --backend cuda --cluster h200-1
            --strata "$B/strata" --python "$py" --dir "$d" --out "$out")
    run capacity.log 168 "$py" "${search[@]}" --system strata --offload-param none --trial-timeout 140 \
      --budget 160
    run capacity.log 153 "$py" "${search[@]}" --system fsdp2 --trial-timeout 125 --budget 145
    DS_ACCELERATOR=cuda run capacity.log 133 "$py" "${search[@]}" --system deepspeed --start 1 --trial-timeout 115 \
      --budget 125
    rm -rf "$d"
    grep -E "^(largest|next rung|## |capacity_search.py|===)" "$out/capacity.log"
    cat "$out"/capacity-*.md 2>/dev/null
    ;;
  *) echo "gpu-check.sh: unknown part $part (${known[*]})" >&2; exit 2 ;;
  esac
done
