#!/usr/bin/env bash
# scripts/two-nodes.sh: its refusals, then (as root, where network namespaces can be made)
# a real run: 4 ranks in two namespaces, the traffic through the shaping qdiscs, a TCP
# stream over the link, strata bench collectives in its three scopes, ranks placed round
# robin refused by Strata's node layout, and nothing of the run's left behind, after a
# clean run and after a failing one. Exit 77 (CTest's skip) when namespaces cannot be
# made here. Usage: test_two_nodes.sh STRATA_BINARY
set -uo pipefail
cd "$(dirname "$0")/../.."
script=scripts/two-nodes.sh
strata=${1:?usage: test_two_nodes.sh STRATA_BINARY}
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_refusal PATTERN ARGS...: exits 2 and says PATTERN on stderr
expect_refusal() {
  local pattern=$1; shift
  local err rc
  err=$(bash "$script" "$@" 2>&1 > /dev/null); rc=$?
  [[ $rc == 2 ]] || fail "'$*' exited $rc, not 2 ($err)"
  [[ $err == *"$pattern"* ]] || fail "'$*' said '$err', not '$pattern'"
  echo "refused as expected: $* -> $err"
}
expect_refusal "unknown part 'nosuch' (check collectives run)" nosuch
expect_refusal "name a part" --rate 1gbit
expect_refusal "run needs a command after --" run
expect_refusal "is not a tc rate" --rate fast check
expect_refusal "--ranks-per-node must be a whole number" --ranks-per-node 0 check
expect_refusal "is not a time" --delay soon check
expect_refusal "unknown option '--nope'" --nope check
bash "$script" --help | grep -q "collectives  strata bench collectives" || fail "--help does not list the parts"

[[ $(id -u) == 0 ]] || { echo "SKIP: not root, so no network namespaces"; exit 77; }
probe=stprobe$$
ip netns add "$probe" 2> /dev/null || { echo "SKIP: cannot make a network namespace here"; exit 77; }
ip netns del "$probe"

tmp=$(mktemp -d /tmp/test-two-nodes.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
out=$(bash "$script" --rate 200mbit --out "$tmp/out" check 2>&1) || fail "check failed: $out"
echo "$out"
ns=$(sed -n 's/^two-nodes.sh: namespaces \([^ ]*\) .* and \([^ ]*\) .*/\1 \2/p' <<< "$out")
[[ -n $ns ]] || fail "the run did not name its namespaces"
read -r nsa nsb <<< "$ns"
grep -q "rate 200mbit each way" <<< "$out" || fail "the shaping asked for is not reported"
for r in 0 1 2 3; do
  grep -q "^rank $r of 4: local rank $((r % 2)) of 2 on $([[ $r -lt 2 ]] && echo "$nsa" || echo "$nsb")," "$tmp/out/ranks.txt" ||
    fail "rank $r is not local rank $((r % 2)) of 2 in its own namespace: $(cat "$tmp/out/ranks.txt")"
done
# Every rank's launch and output crossed the link (the daemon of the second namespace
# talks to mpirun in the first): both ends' shaping qdiscs passed bytes.
while read -r dev n _; do
  [[ $n -gt 0 ]] || fail "$dev's shaping qdisc passed no bytes"
done < "$tmp/out/qdisc.txt"
[[ $(wc -l < "$tmp/out/qdisc.txt") == 2 ]] || fail "expected both ends' qdisc counters: $(cat "$tmp/out/qdisc.txt")"
left() { ip netns list | grep -E "^($1|$2)( |$)"; ip -o link show | grep -E "st[0-9]+-v[ab]"; }
[[ -z $(left "$nsa" "$nsb") ]] || fail "left behind: $(left "$nsa" "$nsb")"
grep -q "^one TCP stream 64 MiB over the link in" "$tmp/out/link.txt" || fail "no TCP stream over the link: $(cat "$tmp/out/link.txt")"
# strata bench collectives over the link: every scope, every element checked (it exits 1
# on a wrong one), and the across-nodes table is there.
out=$(bash "$script" --strata "$strata" --out "$tmp/coll" collectives -- --min-bytes 64K --max-bytes 256K \
  --step-factor 4 --iters 2 --warmup 1 2>&1) || fail "collectives failed: $out"
for table in "all_gather, world: 4 ranks" "reduce_scatter, across nodes: 2 ranks, one a node, 2 such groups at once" \
  "all_gather, within each node: 2 ranks, 2 node(s) at once" "nodes: 4 ranks: 2 nodes of 2 (from the launcher)" \
  "wrong elements: 0"; do
  grep -qF "$table" "$tmp/coll/collectives.txt" || fail "no '$table' in: $(cat "$tmp/coll/collectives.txt")"
done
# Round-robin placement puts rank 1 on the second node as its local rank 0: the node
# layout refuses it on every rank, naming the fix, rather than shard by the wrong nodes.
out=$(bash "$script" --strata "$strata" --map-by node run -- "$strata" bench collectives --scope node \
  --min-bytes 1K --max-bytes 1K --iters 1 2>&1) && fail "round-robin placement was accepted: $out"
grep -q "ranks are not placed on nodes in order.*--map-by slot" <<< "$out" || fail "round robin refused without the reason: $out"
# Without sch_netem, a delay asked for is refused rather than left out.
if grep -q "no sch_netem" <<< "$out"; then
  expect_refusal "needs the kernel's sch_netem qdisc" --delay 1ms check
fi
# A failing command: its status comes back, and nothing is left behind either.
out=$(bash "$script" --ranks-per-node 1 run -- /bin/false 2>&1); rc=$?
[[ $rc != 0 ]] || fail "a failing command gave exit 0"
read -r nsa nsb <<< "$(sed -n 's/^two-nodes.sh: namespaces \([^ ]*\) .* and \([^ ]*\) .*/\1 \2/p' <<< "$out")"
[[ -n $nsa && -z $(left "$nsa" "$nsb") ]] || fail "after a failing run, left behind: $(left "$nsa" "$nsb")"
echo "PASS"
