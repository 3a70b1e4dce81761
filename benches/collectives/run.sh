#!/bin/bash
# benches/collectives/run.sh - issue 15's side-by-side benchmark: rocectl's collectives
# (`rocectl coll-perf`, out of place, f32 sum, max over ranks of the mean per call) next to the
# peers a user would otherwise pick and the ring "link limit", in ONE run, round-robin, on the
# same namespaces. Root (apt-get, ip netns). Writes benches/results/collectives.md (summarize.py;
# RESULTS=<file> writes elsewhere, e.g. a loss-only run:
#   PEERS=faults NPS=2 LINKS=veth REPS=1 RESULTS=benches/results/collectives-loss.md benches/collectives/run.sh)
#
#   benches/collectives/run.sh                        # everything (~15 min with REPS=3)
#   REPS=1 NPS=2 LINKS=veth PEERS="rocectl openmpi" benches/collectives/run.sh   # a quick subset
#
# This is a copy of shared/perf-scripts/collectives-peers.sh (the study's reference runner; its
# harnesses are copied into harness/), with the peers `rocectl`, `rocectl_busypoll` and `rocectl_block` added:
#   rocectl          `rocectl coll-perf all_reduce -a 3 -c 1` per size, each rank in the same
#                    namespace as the peers' ranks (veth: 198.18.0.<i+1>; lo: 127.0.0.<i+1>),
#                    torchrun's variables; ROCECTL ($ROCECTL, default target/release/rocectl)
#   rocectl_busypoll the same with --busy-poll
#   rocectl_block    the same with --spin off (sleep at once: the default before the spin; on
#                    this VM a wake-up costs ~35 us, the kernel's blocking UDP ping-pong 75 us)
#
# Links (all traffic stays inside namespaces this script creates, and deletes on exit):
#   lo   : every rank in netns colp-lo, which has only `lo` (127.0.0.1).
#   veth : rank i in netns colp-r<i> with veth cv<i> = 198.18.0.<i+1>/24 (RFC 2544 benchmarking
#          range), all veths bridged by br0 in netns colp-br (198.18.0.254, used only by mpirun's
#          PMIx server). MTU $MTU (default 9000). Default veth offloads: TCP/GSO super-packets
#          cross unsegmented, so TCP peers see more than per-packet "wire" rates.
# Peers (Debian 12 packages; their own defaults otherwise):
#   openmpi   MPI_Allreduce, Open MPI 4.1.4, pml ob1 + btl tcp,self (TCP BTL), coll/tuned default
#   openmpi_yield  the same with --mca mpi_yield_when_idle 1 (what mpirun sets itself when np > cores)
#   mpich     MPI_Allreduce, MPICH 4.0.2 (ch4:ucx), UCX_TLS=tcp
#   mpi4py    mpi4py 3.1.4 Comm.Allreduce on numpy, over Open MPI as above
#   gloo      Debian libgloo (git 2022-05-18), TCP transport, FileStore rendezvous; algorithms
#             $GLOO_ALGOS (ring = gloo::allreduce, what torch's gloo backend runs)
#   torch     torch.distributed (Debian python3-torch 1.13, CPU) backend "gloo", tcp:// init
#   faults    (only when named in PEERS; veth) kill -9 of rank 1, a cut-off rank 1 (nft drops all), and
#             random loss on rank 1 (LOSS_PCTS): what torch/gloo and Open MPI report, and how fast
#             they and rocectl run at that loss
#   limit     N concurrent flows in a ring (rank i -> i+1): iperf3 TCP, and udpbw (perf-scripts/udpbw.c)
#             UDP 4112-B datagrams (12 BTH + 4096 + 4 ICRC) with sendmmsg/recvmmsg and GSO->GRO.
#             A ring allreduce's busbw cannot exceed the per-flow rate of this test.
# Output: one line per measurement, nccl-tests columns (time = max over ranks of the mean per call,
# us; algbw = bytes/time in 1e9 B/s; busbw = algbw*2(n-1)/n; #wrong = elements != exact sum),
# "# load" lines, then a table of medians over REPS. Everything is appended to $OUT too.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$HERE/harness
ROCECTL=${ROCECTL:-$(cd "$HERE/../.." && pwd)/target/release/rocectl}
BUILD=${BUILD:-/tmp/collectives-bench-build}
OUT=${OUT:-$BUILD/results-$(date +%Y%m%d-%H%M%S).txt}
SIZES=${SIZES:-4096,65536,1048576,16777216,67108864}
NPS=${NPS:-"2 4"}
LINKS=${LINKS:-"lo veth"}
PEERS=${PEERS:-"limit rocectl rocectl_busypoll rocectl_block openmpi openmpi_yield mpich mpi4py gloo torch"}
MPICH_OVERSUB=${MPICH_OVERSUB:-0}  # MPICH (ch4:ucx) busy-polls: with more ranks than cores it crawls
                                   # (24 ms per 4 KiB allreduce at np=4 here) and hung past 300 s
                                   # after its last result, so np > nproc is skipped unless this is 1
GLOO_ALGOS=${GLOO_ALGOS:-ring,bcube,ring_chunked,halving_doubling}
TARGET=${TARGET:-0.25}     # seconds of timed calls per size (at least 3 calls)
REPS=${REPS:-3}            # round-robin repetitions; the summary takes the median
MTU=${MTU:-9000}
LIMIT_SECS=${LIMIT_SECS:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
FAULT_PG_TIMEOUT=${FAULT_PG_TIMEOUT:-20}   # torch process-group timeout in the fault probes (s)
FAULT_WARMUP=${FAULT_WARMUP:-12}          # seconds between launching a probe and injecting the fault
LOSS_PCTS=${LOSS_PCTS:-"1 5"}             # random loss (%) on rank 1's input, np=2
P=colb                     # namespace prefix (this script's own; the study's is colp)
PY=/usr/bin/python3        # Debian's python, where python3-torch and python3-mpi4py live

[ "$(id -u)" = 0 ] || { echo "run as root (apt-get, ip netns)"; exit 1; }
case " $PEERS " in *" rocectl"*)
  [ -x "$ROCECTL" ] || { echo "no rocectl at $ROCECTL: cargo build --release -p rocectl (or set ROCECTL)"; exit 1; } ;;
esac
mkdir -p "$BUILD"
log() { echo "$@" | tee -a "$OUT"; }

# ---------------------------------------------------------------- install (idempotent)
PKGS="openmpi-bin libopenmpi-dev mpich libmpich-dev python3-mpi4py python3-numpy libgloo-dev
      python3-torch iperf3 g++ make iproute2"
missing=$(for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "# installing: $missing" >&2
  apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >&2 \
    || { echo "apt-get install failed" >&2; exit 1; }
fi

# ---------------------------------------------------------------- build (only if sources changed)
build() { # out src cmd...
  local out=$1 src=$2; shift 2
  if [ ! -x "$out" ] || [ "$src" -nt "$out" ]; then "$@" || { echo "build of $out failed" >&2; exit 1; }; fi
}
build "$BUILD/mpi_allreduce_perf.openmpi" "$SRC/mpi_allreduce_perf.c" mpicc.openmpi -O2 -o "$BUILD/mpi_allreduce_perf.openmpi" "$SRC/mpi_allreduce_perf.c"
build "$BUILD/mpi_allreduce_perf.mpich" "$SRC/mpi_allreduce_perf.c" mpicc.mpich -O2 -o "$BUILD/mpi_allreduce_perf.mpich" "$SRC/mpi_allreduce_perf.c"
build "$BUILD/gloo_allreduce_perf" "$SRC/gloo_allreduce_perf.cc" g++ -O2 -std=c++17 -o "$BUILD/gloo_allreduce_perf" "$SRC/gloo_allreduce_perf.cc" -lgloo -lpthread
build "$BUILD/udpbw" "$SRC/udpbw.c" gcc -O2 -o "$BUILD/udpbw" "$SRC/udpbw.c"
cat > "$BUILD/nswrap-ompi.sh" <<EOF
#!/bin/sh
exec ip netns exec $P-r\$OMPI_COMM_WORLD_RANK "\$@"
EOF
cat > "$BUILD/nswrap-mpich.sh" <<EOF
#!/bin/sh
exec ip netns exec $P-r\$PMI_RANK "\$@"
EOF
chmod +x "$BUILD"/nswrap-*.sh

# ---------------------------------------------------------------- namespaces
PIDS=""
cleanup() {
  for p in $PIDS; do kill "$p" 2>/dev/null; done
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$P-(lo|br|r[0-9]+)\$"); do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
cleanup   # stale ones from an interrupted run
ip netns add $P-lo && ip -n $P-lo link set lo up
NMAX=$(for n in $NPS; do echo "$n"; done | sort -n | tail -1)
ip netns add $P-br; ip -n $P-br link set lo up
ip -n $P-br link add br0 type bridge; ip -n $P-br link set br0 mtu "$MTU" up
ip -n $P-br addr add 198.18.0.254/24 dev br0
for i in $(seq 0 $((NMAX - 1))); do
  ip netns add $P-r$i; ip -n $P-r$i link set lo up
  ip link add cv$i netns $P-r$i mtu "$MTU" type veth peer name cb$i netns $P-br mtu "$MTU"
  ip -n $P-r$i addr add 198.18.0.$((i + 1))/24 dev cv$i; ip -n $P-r$i link set cv$i up
  ip -n $P-br link set cb$i master br0; ip -n $P-br link set cb$i up
done
sleep 1

ns_of() { [ "$1" = lo ] && echo $P-lo || echo $P-r$2; }    # link rank -> namespace
ip_of() { [ "$1" = lo ] && echo 127.0.0.1 || echo 198.18.0.$(($2 + 1)); }
if_of() { [ "$1" = lo ] && echo lo || echo cv$2; }
load() { log "# load $(cut -d' ' -f1-3 /proc/loadavg) ($(date +%T)) $*"; }

# ---------------------------------------------------------------- the limit: N flows in a ring
limit_tcp() { # link n
  local link=$1 n=$2 i tmp; tmp=$(mktemp -d -p "$BUILD")
  for i in $(seq 0 $((n - 1))); do
    ip netns exec "$(ns_of "$link" $(((i + 1) % n)))" iperf3 -s -1 -p $((5300 + i)) -B "$(ip_of "$link" $(((i + 1) % n)))" >/dev/null 2>&1 &
  done
  sleep 0.5
  for i in $(seq 0 $((n - 1))); do
    ip netns exec "$(ns_of "$link" $i)" iperf3 -c "$(ip_of "$link" $(((i + 1) % n)))" -p $((5300 + i)) -t "$LIMIT_SECS" -J >"$tmp/c$i.json" 2>/dev/null &
  done
  wait
  $PY - "$link" "$n" "$tmp" <<'EOF' | tee -a "$OUT"
import json, sys, glob
link, n, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = []
for f in sorted(glob.glob(d + "/c*.json")):
    try: r.append(json.load(open(f))["end"]["sum_received"]["bits_per_second"] / 1e9)
    except Exception: r.append(float("nan"))
mn = min(r)
print(f"{'limit:tcp-ring(iperf3)':<28} {link:<6} {n:3d}  flows Gbit/s {' '.join(f'{x:.2f}' for x in r)}  "
      f"per-flow min {mn:.2f} Gbit/s = busbw ceiling {mn/8:.3f} GB/s  sum {sum(r):.2f} Gbit/s")
EOF
  rm -rf "$tmp"
}
limit_udp() { # link n mode(mmsg|gso)
  local link=$1 n=$2 mode=$3 i tmp rmode; tmp=$(mktemp -d -p "$BUILD")
  rmode=$([ "$mode" = gso ] && echo gro || echo mmsg)
  for i in $(seq 0 $((n - 1))); do
    ip netns exec "$(ns_of "$link" $(((i + 1) % n)))" "$BUILD/udpbw" recv "$(ip_of "$link" $(((i + 1) % n)))" $((9100 + i)) "$rmode" 4112 "$LIMIT_SECS" >"$tmp/r$i" &
  done
  sleep 0.3
  for i in $(seq 0 $((n - 1))); do
    ip netns exec "$(ns_of "$link" $i)" "$BUILD/udpbw" send "$(ip_of "$link" $(((i + 1) % n)))" $((9100 + i)) "$mode" 4112 "$LIMIT_SECS" >/dev/null &
  done
  wait
  local rates; rates=$(cat "$tmp"/r* | sed -n 's/.*Gbps=\([0-9.]*\).*/\1/p' | tr '\n' ' ')
  $PY - "$link" "$n" "$mode" "$rates" <<'EOF' | tee -a "$OUT"
import sys
link, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = [float(x) for x in sys.argv[4].split()] or [float("nan")]
mn = min(r)
print(f"{'limit:udp4112-ring(' + mode + ')':<28} {link:<6} {n:3d}  flows Gbit/s {' '.join(f'{x:.2f}' for x in r)}  "
      f"per-flow min {mn:.2f} Gbit/s = busbw ceiling {mn/8:.3f} GB/s  sum {sum(r):.2f} Gbit/s")
EOF
  rm -rf "$tmp"
}

# ---------------------------------------------------------------- the peers
run_openmpi() { # link n prog args...
  local link=$1 n=$2; shift 2
  local common=(--allow-run-as-root --oversubscribe -np "$n" --mca pml ob1 --mca btl tcp,self ${OMPI_EXTRA:-})
  if [ "$link" = lo ]; then
    timeout "$RUN_TIMEOUT" ip netns exec $P-lo mpirun.openmpi "${common[@]}" --mca btl_tcp_if_include lo "$@"
  else  # mpirun in the bridge namespace; its PMIx server listens on br0 so ranks in other netns reach it
    timeout "$RUN_TIMEOUT" ip netns exec $P-br env PMIX_MCA_ptl_tcp_if_include=br0 PMIX_MCA_ptl_tcp_remote_connections=1 \
      mpirun.openmpi "${common[@]}" --mca oob_tcp_if_include br0 --mca btl_tcp_if_include 198.18.0.0/24 \
      "$BUILD/nswrap-ompi.sh" "$@"
  fi
}
peer_openmpi() { run_openmpi "$1" "$2" "$BUILD/mpi_allreduce_perf.openmpi" openmpi-4.1.4/tcp "$1" "$SIZES" "$TARGET"; }
peer_openmpi_yield() { OMPI_EXTRA="--mca mpi_yield_when_idle 1" run_openmpi "$1" "$2" "$BUILD/mpi_allreduce_perf.openmpi" openmpi-4.1.4/tcp+yield "$1" "$SIZES" "$TARGET"; }
peer_mpi4py() { run_openmpi "$1" "$2" $PY "$SRC/mpi4py_allreduce_perf.py" mpi4py-3.1.4/openmpi-tcp "$1" "$SIZES" "$TARGET"; }
peer_mpich() {
  local link=$1 n=$2
  if [ "$n" -gt "$(nproc)" ] && [ "$MPICH_OVERSUB" != 1 ]; then echo "# mpich np=$n > $(nproc) cpus: skipped (MPICH_OVERSUB=1 runs it)"; return; fi
  if [ "$link" = lo ]; then
    timeout "$RUN_TIMEOUT" ip netns exec $P-lo mpiexec.hydra -n "$n" -launcher fork -env UCX_TLS tcp -env UCX_NET_DEVICES lo \
      "$BUILD/mpi_allreduce_perf.mpich" mpich-4.0.2/ucx-tcp "$link" "$SIZES" "$TARGET"
  else
    timeout "$RUN_TIMEOUT" mpiexec.hydra -n "$n" -launcher fork -env UCX_TLS tcp \
      "$BUILD/nswrap-mpich.sh" "$BUILD/mpi_allreduce_perf.mpich" mpich-4.0.2/ucx-tcp "$link" "$SIZES" "$TARGET"
  fi
}
peer_gloo() {
  local link=$1 n=$2 i store; store=$(mktemp -d -p "$BUILD")
  for i in $(seq 0 $((n - 1))); do
    timeout "$RUN_TIMEOUT" ip netns exec "$(ns_of "$link" $i)" "$BUILD/gloo_allreduce_perf" $i "$n" "$store" \
      "$(ip_of "$link" $i)" "$link" "$SIZES" "$GLOO_ALGOS" "$TARGET" &
  done
  wait; rm -rf "$store"
}
peer_torch() {
  local link=$1 n=$2 i port=$((29500 + RANDOM % 1000)) probe=""
  [ "$link$n" = lo2 ] && probe=--probe
  for i in $(seq 0 $((n - 1))); do
    timeout "$RUN_TIMEOUT" ip netns exec "$(ns_of "$link" $i)" env GLOO_SOCKET_IFNAME="$(if_of "$link" $i)" \
      $PY "$SRC/torch_allreduce_perf.py" $i "$n" "$(ip_of "$link" 0)" $port "$link" "$SIZES" "$TARGET" $probe 2>/dev/null &
  done
  wait
}

# rocectl coll-perf: one run per size (iterations for about $TARGET s at the speeds seen here),
# -a 3 (max over ranks of the mean per call, as the harnesses), -c 1 (every value checked),
# out-of-place columns; printed in the harnesses' line format (algbw and busbw recomputed from the
# time, with three decimals as the harnesses print them, not coll-perf's two).
rocectl_iters() { # size -> iterations
  case $1 in 4096) echo 1000 ;; 65536) echo 300 ;; 1048576) echo 40 ;; 16777216) echo 4 ;; *) echo 3 ;; esac
}
peer_rocectl() { # link n [extra coll-perf flags]
  local link=$1 n=$2 label=${ROCECTL_LABEL:-rocectl/coll-perf} size i tmp; shift 2; tmp=$(mktemp -d -p "$BUILD")
  for size in ${SIZES//,/ }; do
    local port=$((31500 + RANDOM % 1000)) master; master=$(ip_of "$link" 0)
    [ "$link" = lo ] && master=127.0.0.1
    for i in $(seq 0 $((n - 1))); do
      local addr; addr=$(ip_of "$link" $i); [ "$link" = lo ] && addr=127.0.0.$((i + 1))
      timeout "$RUN_TIMEOUT" ip netns exec "$(ns_of "$link" $i)" env RANK=$i WORLD_SIZE="$n" LOCAL_RANK=$i \
        LOCAL_WORLD_SIZE="$n" MASTER_ADDR="$master" MASTER_PORT=$port ROCECTL_COLL_ADDR="$addr" \
        "$ROCECTL" coll-perf all_reduce -b "$size" -e "$size" -n "$(rocectl_iters "$size")" -w 2 -c 1 -a 3 -T 60 "$@" \
        >"$tmp/o$i" 2>"$tmp/e$i" &
    done
    wait
    cat "$tmp"/e* >&2
    awk -v l="$label" -v k="$link" -v n="$n" -v it="$(rocectl_iters "$size")" \
      '!/^#/ && NF >= 13 { alg = $1 / ($6 * 1000); printf "%-28s %-6s %3d %10d %10d  %-5s %-4s %4s %10.1f %7.3f %7.3f %6d %6d\n", l, k, n, $1, $2, $3, $4, $5, $6, alg, alg * 2 * (n - 1) / n, $9, it }' "$tmp/o0"
  done
  rm -rf "$tmp"
}
BUSYPOLL_OVERSUB=${BUSYPOLL_OVERSUB:-0}  # spinning ranks beyond the cores starve each other (13 ms per 4 KiB
                                        # at np=4 here): skipped there unless this is 1
peer_rocectl_busypoll() {
  if [ "$2" -gt "$(nproc)" ] && [ "$BUSYPOLL_OVERSUB" != 1 ]; then echo "# rocectl busy-poll np=$2 > $(nproc) cpus: skipped (BUSYPOLL_OVERSUB=1 runs it)"; return; fi
  ROCECTL_LABEL=rocectl/coll-perf+busypoll peer_rocectl "$1" "$2" --busy-poll
}
peer_rocectl_block() {
  ROCECTL_LABEL=rocectl/coll-perf+block peer_rocectl "$1" "$2" --spin off
}

# ---------------------------------------------------------------- failure behaviour (veth only)
# faults: what a peer does when a rank dies (kill -9), when a rank is cut off (nft drops all its
# packets), and how throughput degrades with random loss (nft drops LOSS_PCT % of what rank 1 gets).
fault_line() { printf '%-28s %-6s %3s  %s\n' "$1" veth "$2" "$3" | tee -a "$OUT"; }
fault_torch() { # n kill|partition
  local n=$1 how=$2 i port=$((30500 + RANDOM % 1000)) ff tmp t0; ff=$(mktemp -p "$BUILD"); tmp=$(mktemp -d -p "$BUILD"); echo nan >"$ff"
  for i in $(seq 0 $((n - 1))); do
    ip netns exec $P-r$i env GLOO_SOCKET_IFNAME=cv$i timeout 120 $PY "$SRC/torch_fault_probe.py" $i "$n" 198.18.0.1 $port \
      1048576 60 "$FAULT_PG_TIMEOUT" "$ff" >"$tmp/o$i" 2>"$tmp/e$i" &
  done
  sleep "$FAULT_WARMUP"
  date +%s.%N >"$ff"
  if [ "$how" = kill ]; then kill -9 $(ip netns pids $P-r1) 2>/dev/null
  else ip netns exec $P-r1 nft -f - <<'NFT'
table inet colpfault {
  chain i { type filter hook input priority 0; policy drop; }
  chain o { type filter hook output priority 0; policy drop; }
}
NFT
  fi
  wait
  for i in $(seq 0 $((n - 1))); do
    if [ -s "$tmp/o$i" ]; then fault_line "fault:torch-gloo:$how-r1" "$n" "$(cat "$tmp/o$i")"
    elif [ "$how" = kill ] && [ "$i" = 1 ]; then fault_line "fault:torch-gloo:$how-r1" "$n" "rank 1: killed (kill -9), no report"
    else fault_line "fault:torch-gloo:$how-r1" "$n" "rank $i: no report ($(tail -c 120 "$tmp/e$i" | tr '\n' ' '))"; fi
  done
  [ "$how" = partition ] && ip netns exec $P-r1 nft delete table inet colpfault 2>/dev/null
  rm -rf "$tmp" "$ff"
}
fault_openmpi_kill() { # n
  local n=$1 tmp t0 t1 rc; tmp=$(mktemp -d -p "$BUILD")
  run_openmpi veth "$n" "$BUILD/mpi_allreduce_perf.openmpi" openmpi-4.1.4/tcp veth 1048576 60 1000000 >"$tmp/o" 2>"$tmp/e" &
  local mp=$!
  sleep "$FAULT_WARMUP"
  t0=$(date +%s.%N); kill -9 $(ip netns pids $P-r1) 2>/dev/null
  wait $mp; rc=$?; t1=$(date +%s.%N)
  fault_line "fault:openmpi:kill-r1" "$n" "mpirun exit $rc $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s after kill -9 of rank 1; \
$(grep -m1 -iE 'noticed that|exited on signal|unexpectedly disconnected' "$tmp/e" | cut -c1-120)"
  rm -rf "$tmp"
}
fault_loss() { # n pct
  local n=$1 pct=$2
  ip netns exec $P-r1 nft -f - <<NFT
table inet colploss {
  chain i { type filter hook input priority 0; numgen random mod 100 < $pct drop; }
}
NFT
  SIZES=1048576,16777216 OMPI_EXTRA="--mca mpi_yield_when_idle 1" run_openmpi veth "$n" "$BUILD/mpi_allreduce_perf.openmpi" \
    "openmpi-4.1.4/tcp+yield+loss$pct%" veth 1048576,16777216 "$TARGET" 2>>"$BUILD/stderr.log" | tee -a "$OUT"
  SIZES=1048576,16777216 LABEL_SUFFIX="+loss$pct%" peer_torch veth "$n" | tee -a "$OUT"
  SIZES=1048576,16777216 ROCECTL_LABEL="rocectl/coll-perf+loss$pct%" peer_rocectl veth "$n" 2>>"$BUILD/stderr.log" | tee -a "$OUT"
  ip netns exec $P-r1 nft delete table inet colploss 2>/dev/null
  ip netns exec $P-r1 nft list tables 2>/dev/null | grep -q colploss && echo "warning: loss table left" >&2
}
faults() {
  load "faults"
  for n in $NPS; do
    fault_torch "$n" kill
    fault_torch "$n" partition
    fault_openmpi_kill "$n"
  done
  for pct in $LOSS_PCTS; do fault_loss 2 "$pct"; done
}

log "# collectives-peers.sh $(date -Is) host $(hostname) $(nproc) cpus, kernel $(uname -r); sizes $SIZES; REPS=$REPS TARGET=${TARGET}s MTU=$MTU"
log "# $(printf '%-26s %-6s %3s %10s %10s  %-5s %-4s %4s %10s %7s %7s %6s %6s' peer link np size count type redop root 'time(us)' algbw busbw '#wrong' iters)"
for rep in $(seq 1 "$REPS"); do
  for link in $LINKS; do
    for n in $NPS; do
      for peer in $PEERS; do
        [ "$peer" = faults ] && continue   # once, after the loops
        load "rep $rep $peer $link np=$n"
        case $peer in
          limit) limit_tcp "$link" "$n"; limit_udp "$link" "$n" mmsg; limit_udp "$link" "$n" gso ;;
          *) "peer_$peer" "$link" "$n" 2>>"$BUILD/stderr.log" \
               | awk '$6 == "float" || /^# / { print; fflush(); next } { print > "/dev/stderr" }' 2>>"$BUILD/stderr.log" \
               | tee -a "$OUT" ;;
        esac
      done
    done
  done
done

case " $PEERS " in *" faults "*) faults ;; esac

# ---------------------------------------------------------------- medians over repetitions
log "#"
log "# medians over $REPS repetition(s) [min-max]; busbw GB/s (allreduce) or per-flow ceiling GB/s (limit)"
$PY - "$OUT" <<'EOF' | tee -a "$OUT.summary"
import re, sys, statistics as st, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    if line.startswith(("#", " ", "fault:")): continue   # comments, earlier summaries, fault probes
    f = line.split()
    if not f: continue
    if f[0].startswith("limit:"):
        m = re.search(r"busbw ceiling ([\d.na]+) GB/s", line)
        rows.setdefault((f[0], f[1], f[2], "-"), []).append((float(m.group(1)), float("nan")))
    elif len(f) >= 13:
        rows.setdefault((f[0], f[1], f[2], f[3]), []).append((float(f[10]), float(f[8])))
print(f"# {'peer':<28} {'link':<5} {'np':>3} {'size':>10} {'busbw GB/s median [min-max]':>30} {'time us median':>15}")
for (peer, link, n, size), v in rows.items():
    b = [x[0] for x in v]; t = [x[1] for x in v]
    print(f"  {peer:<28} {link:<5} {n:>3} {size:>10} {st.median(b):>10.3f} [{min(b):.3f}-{max(b):.3f}] {st.median(t):>15.1f}")
EOF
cat "$OUT.summary" >> "$OUT"
echo "# results: $OUT (summary also in $OUT.summary); peer stderr: $BUILD/stderr.log" >&2
RESULTS=${RESULTS:-$HERE/../results/collectives.md}
$PY "$HERE/summarize.py" "$OUT" "$RESULTS" && echo "# table: $RESULTS" >&2
