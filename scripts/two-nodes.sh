#!/usr/bin/env bash
# Two "nodes" on this machine: two network namespaces joined by a veth pair whose egress
# is shaped with tc on both ends (a token bucket at --rate; a netem delay of --delay where
# the kernel has sch_netem), and an mpirun over TCP that starts --ranks-per-node ranks in
# each. Inside a namespace the ranks talk through shared memory (Open MPI's vader BTL),
# unshaped; between them only over the veth pair, whose addresses are the only ones they
# have (no route leaves the pair). Everything made is removed at exit, on error and on
# Ctrl-C: the two namespaces (which take the veth pair with them) and a temporary folder.
# Needs root, iproute2's ip and tc, and Open MPI's mpirun.
#
# Usage: bash scripts/two-nodes.sh [OPTIONS] PART [-- ARGS...]
#   PART:
#     check        4 ranks (2 a node): each prints its host, rank and local rank; then the
#                  bytes the shaping qdiscs passed, which shows the traffic crossed the link;
#                  then one TCP stream's throughput over the link (64 MiB, python3), the
#                  reference for the collectives across it
#     collectives  strata bench collectives --scope world node cross over 2 x RPN ranks:
#                  all ranks, each node's ranks (shared memory), one rank a node (across
#                  the link), each beside plain MPI's reference; ARGS go to it
#     run          ARGS is a command run by every rank (mpirun -np 2*RPN ARGS)
#   OPTIONS:
#     --rate R            tc rate of each direction of the link (default 1gbit)
#     --delay D           one-way delay (default 0.2ms where sch_netem exists, else none,
#                         said; asking for one without sch_netem is an error)
#     --ranks-per-node N  ranks in each namespace (default 2)
#     --strata PATH       the strata binary (default ./build/strata)
#     --map-by slot|node  rank placement (default slot: ranks 0..RPN-1 in the first namespace;
#                         node: round robin, which Strata's node layout refuses)
#     --out DIR           where the tables and the qdisc statistics go (default: printed only)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

die() { echo "two-nodes.sh: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

rate=1gbit delay= delay_asked=0 rpn=2 strata=$root/build/strata out= part= map_by=slot
while [[ $# -gt 0 ]]; do
  case $1 in
  -h | --help) usage; exit 0 ;;
  --rate) [[ $# -ge 2 ]] || die "--rate needs a value (e.g. 1gbit)"; rate=$2; shift 2 ;;
  --delay) [[ $# -ge 2 ]] || die "--delay needs a value (e.g. 0.2ms)"; delay=$2; delay_asked=1; shift 2 ;;
  --ranks-per-node) [[ $# -ge 2 ]] || die "--ranks-per-node needs a value"; rpn=$2; shift 2 ;;
  --strata) [[ $# -ge 2 ]] || die "--strata needs a path"; strata=$2; shift 2 ;;
  --out) [[ $# -ge 2 ]] || die "--out needs a folder"; out=$2; shift 2 ;;
  --map-by) [[ $# -ge 2 && ($2 == slot || $2 == node) ]] || die "--map-by takes slot or node"; map_by=$2; shift 2 ;;
  --) shift; break ;;
  -*) die "unknown option '$1' (see --help)" ;;
  *) [[ -z $part ]] || { [[ $part == run ]] && break; die "one part at a time: '$part' and '$1' (put a command after --)"; }
     part=$1; shift ;;
  esac
done
args=("$@")
case $part in
check | collectives) ;;
run) [[ ${#args[@]} -gt 0 ]] || die "run needs a command after --, e.g. run -- ./build/strata bench step ..." ;;
"") die "name a part: check, collectives or run (see --help)" ;;
*) die "unknown part '$part' (check collectives run)" ;;
esac
[[ $rpn =~ ^[1-9][0-9]*$ && $rpn -le 64 ]] || die "--ranks-per-node must be a whole number from 1 to 64, not '$rpn'"
[[ $rate =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] ||
  die "--rate '$rate' is not a tc rate: a number and a unit, e.g. 100mbit, 1gbit, 125mbps"
[[ -z $delay || $delay =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || die "--delay '$delay' is not a time: e.g. 200us, 0.2ms"
[[ $(id -u) == 0 ]] || die "needs root to make network namespaces (run it as root, or under sudo)"
for tool in ip tc mpirun; do command -v $tool > /dev/null || die "'$tool' is not on PATH (apt-get install iproute2 openmpi-bin)"; done
if [[ $part == collectives || ${args[0]:-} == */strata ]]; then
  [[ -x $strata ]] || die "no strata binary at $strata: build it (bash scripts/build.sh) or pass --strata"
fi
[[ -z $out ]] || mkdir -p "$out"

# Names and addresses of this run's own: the pid keeps two runs apart, and a free /24 in
# 10.231-254.x is chosen so nothing already routed here is shadowed.
tag=st$$
nsa=$tag-a nsb=$tag-b va=$tag-va vb=$tag-vb
net=
for third in $(seq 231 254); do
  for fourth in $(seq 0 255); do
    cand=10.$third.$fourth
    ip -o addr show | grep -q " $cand\." || ip route show | grep -q "^$cand\." || { net=$cand; break 2; }
  done
done
[[ -n $net ]] || die "no free 10.x.y.0/24 for the link"
ipa=$net.1 ipb=$net.2
tmp=$(mktemp -d /tmp/strata-two-nodes.XXXXXX)

made=0
cleanup() {
  local rc=$?
  if [[ $made == 1 ]]; then
    ip netns del "$nsa" 2> /dev/null || true
    ip netns del "$nsb" 2> /dev/null || true
  fi
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$nsa"
made=1
ip netns add "$nsb"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$nsa"
ip link set "$vb" netns "$nsb"
ip -n "$nsa" addr add "$ipa/24" dev "$va"
ip -n "$nsb" addr add "$ipb/24" dev "$vb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "$va" up
ip -n "$nsb" link set "$vb" up

# Shaping, both directions: netem (delay, and its rate) where the kernel has it, else a
# token bucket alone. The bucket holds a few milliseconds at the rate, so TCP sees a queue
# rather than drops.
netem=0
if ip netns exec "$nsa" tc qdisc add dev "$va" root netem delay 0ms 2> /dev/null; then
  netem=1
  ip netns exec "$nsa" tc qdisc del dev "$va" root
fi
if [[ $delay_asked == 1 && $netem == 0 && -n $delay ]]; then
  die "--delay $delay needs the kernel's sch_netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM): leave --delay out to shape the rate alone"
fi
[[ $delay_asked == 1 || $netem == 0 ]] || delay=0.2ms
for end in "$nsa $va" "$nsb $vb"; do
  set -- $end
  if [[ $netem == 1 && -n $delay ]]; then
    ip netns exec "$1" tc qdisc add dev "$2" root netem delay "$delay" rate "$rate" limit 10000
  else
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst 256kb latency 100ms
  fi
done
shaping="rate $rate each way"
if [[ -n $delay ]]; then shaping+=", delay $delay each way (netem)"; else shaping+=", no delay shaping (this kernel has no sch_netem)"; fi
echo "two-nodes.sh: namespaces $nsa ($ipa) and $nsb ($ipb), veth $va-$vb, $shaping; $rpn ranks a node"

# mpirun runs in the first namespace; it starts the second's daemon through this agent
# (Open MPI's rsh launcher, with 'ip netns exec' for ssh). Each namespace also gets a host
# name of its own (a UTS namespace): Open MPI names its shared-memory segments by host
# name and local rank, so two "nodes" both called by this machine's name would share them.
cat > "$tmp/agent" << EOF
#!/bin/sh
host=\$1; shift
case \$host in
$ipa) exec ip netns exec $nsa unshare --uts /bin/sh -c "hostname $nsa && \$*" ;;
$ipb) exec ip netns exec $nsb unshare --uts /bin/sh -c "hostname $nsb && \$*" ;;
*) echo "two-nodes agent: unknown host \$host" >&2; exit 1 ;;
esac
EOF
chmod +x "$tmp/agent"

pass_env=(-x PATH)  # what the ranks of the second namespace inherit from here
for v in LD_LIBRARY_PATH STRATA_LOG_LEVEL OMP_NUM_THREADS; do [[ -z ${!v:-} ]] || pass_env+=(-x "$v"); done

# mpi N MAP HOSTS CMD...: N ranks over HOSTS ("ipa:2,ipb:2"), mapped by MAP (slot or node).
mpi() {
  local n=$1 map=$2 hosts=$3; shift 3
  ip netns exec "$nsa" unshare --uts env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    /bin/sh -c 'hostname "$0" && exec "$@"' "$nsa" mpirun -np "$n" --host "$hosts" --map-by "$map" --bind-to none \
    --mca plm_rsh_agent "$tmp/agent" --mca btl tcp,vader,self \
    --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
    "${pass_env[@]}" "$@"
}

qdisc_bytes() {  # bytes each end's root qdisc sent
  for end in "$nsa $va" "$nsb $vb"; do
    set -- $end
    ip netns exec "$1" tc -s qdisc show dev "$2" | awk -v d="$2" '/Sent/ {print d ": " $2 " bytes sent through the shaping qdisc"; exit}'
  done
}

tcp_stream() {  # one TCP stream of 64 MiB from the first namespace to the second, timed by the receiver
  local port=$((20000 + $$ % 20000))
  ip netns exec "$nsb" python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
dt = time.perf_counter() - t0
print(f"one TCP stream {n >> 20} MiB over the link in {dt:.3f} s: {n / dt / 1e6:.1f} MB/s ({n * 8 / dt / 1e9:.3f} Gbit/s)")
' "$ipb" "$port" > "$tmp/tcp" &
  local server=$!
  for _ in $(seq 50); do grep -q ready "$tmp/tcp" 2> /dev/null && break; python3 -c 'import time; time.sleep(0.1)'; done
  ip netns exec "$nsa" python3 -c '
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); b = bytes(1 << 20)
for _ in range(64): c.sendall(b)
c.close()' "$ipb" "$port"
  wait $server
  grep -v ready "$tmp/tcp"
}

report() {  # report NAME CMD...: runs CMD, its output to stdout and to $out/NAME
  local name=$1; shift
  if [[ -n $out ]]; then "$@" 2>&1 | tee "$out/$name"; else "$@"; fi
}

both=$ipa:$rpn,$ipb:$rpn
case $part in
check)
  report ranks.txt mpi $((2 * rpn)) "$map_by" "$both" /bin/sh -c \
    'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE: local rank $OMPI_COMM_WORLD_LOCAL_RANK of $OMPI_COMM_WORLD_LOCAL_SIZE on $(hostname), $(ip -o -4 addr show scope global | awk "{print \$4}")"'
  report qdisc.txt qdisc_bytes
  report link.txt tcp_stream
  ;;
collectives)
  scopes=(world cross)
  [[ $rpn -lt 2 ]] || scopes+=(node)
  report collectives.txt mpi $((2 * rpn)) "$map_by" "$both" "$strata" bench collectives --scope "${scopes[@]}" "${args[@]}"
  report qdisc.txt qdisc_bytes
  ;;
run)
  report run.txt mpi $((2 * rpn)) "$map_by" "$both" "${args[@]}"
  report qdisc.txt qdisc_bytes
  ;;
esac
