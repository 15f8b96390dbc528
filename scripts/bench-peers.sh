#!/usr/bin/env bash
# scripts/bench-peers.sh: `stria bench sweep` of seq, shared, random and meta against Stria (its
# FUSE mount and its client library) and, in the same run, ext4 and the peer file systems of
# ../shared/tools/peers.sh, interleaved run by run. Tables (.txt), reports (.json) and charts
# (.svg, .png) go to OUT.
#
# Needs root (FUSE, the peers' daemons) and a release build (cargo build --release -p stria).
# Env: STRIA (binary), PEERS (names for peers.sh; default "ext4 moosefs passthrough juicefs
# glusterfs"; one that does not come up is left out and said so), THREADS (largest count, 4),
# OUT (docs/results/peers), SCALE (1: the sizes below; 2 doubles them, ...), WORKLOADS (which
# sweeps, default "seq shared random meta").
set -u
cd "$(dirname "$0")/.."
S=${STRIA:-target/release/stria}
PEERS_SH=${PEERS_SH:-../shared/tools/peers.sh}
PEERS=${PEERS:-"ext4 moosefs passthrough juicefs glusterfs"}
T=${THREADS:-4} OUT=${OUT:-docs/results/peers} SCALE=${SCALE:-1}
WORKLOADS=${WORKLOADS:-"seq shared random meta"}
DATA=/var/tmp/stria-bench-peers
mkdir -p "$OUT"

"$PEERS_SH" list >/dev/null || { echo "cannot run $PEERS_SH" >&2; exit 1; }
rm -rf "$DATA"; mkdir -p "$DATA"
"$S" up --data "$DATA" --drives 5 --raid 5 --drive-size 4G --mount "$DATA/mnt" \
  --meta-listen 127.0.0.1:0 --storage-listen 127.0.0.1:0 --mgmt-listen 127.0.0.1:0 \
  --nbd-listen 127.0.0.1:0 --api-listen 127.0.0.1:0 > "$DATA.out" 2>&1 &
UP=$!
trap 'kill -TERM $UP 2>/dev/null; wait $UP 2>/dev/null' EXIT
for _ in $(seq 1 300); do [ -f "$DATA/run.json" ] && findmnt -rn --mountpoint "$DATA/mnt" >/dev/null && break; sleep 0.2; done
findmnt -rn --mountpoint "$DATA/mnt" >/dev/null || { echo "stria up did not mount:" >&2; cat "$DATA.out" >&2; exit 1; }

targets=(--path "$DATA/mnt")
for p in $PEERS; do
  if "$PEERS_SH" up "$p" >> "$OUT/peers.log" 2>&1; then
    targets+=(--compare "$("$PEERS_SH" mnt "$p")")
  else
    echo "peer $p did not come up (see $OUT/peers.log); left out" | tee -a "$OUT/notes.txt" >&2
  fi
done
targets+=(--native --data "$DATA")

sweep() {  # sweep WORKLOAD ARGS...
  local w=$1; shift
  case " $WORKLOADS " in *" $w "*) ;; *) return 0 ;; esac
  echo "== stria bench sweep $w -t $T $* (targets: ${targets[*]})" | tee "$OUT/$w.txt"
  "$S" bench sweep "$w" -t "$T" "${targets[@]}" "$@" --no-progress \
    --charts "$OUT" --json "$OUT/$w.json" | tee -a "$OUT/$w.txt"
}
sweep seq --file-size $((256 * SCALE))M --transfer 8M --fsync
sweep shared --block-size $((128 * SCALE))M --transfer 8M --fsync
sweep random --file-size $((256 * SCALE))M --bs 4K --iodepth 4 --seconds $((4 * SCALE))
sweep meta --files $((4000 * SCALE)) --files-per-dir 500 --file-size 4K
