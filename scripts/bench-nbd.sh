#!/usr/bin/env bash
# scripts/bench-nbd.sh: fio nbd-engine rows (1 MiB sequential at iodepth 8, 4 KiB random at
# iodepth 32) against Stria volumes on RAID 0 and RAID 6 targets (5 and 6 drives, then both on
# 12, a usual NVMe server's width, where RAID 6 writes 1.2 times the bytes instead of 1.5) and
# against `nbdkit file` (page cache and cache=none) on the same disk, in one run. Needs fio, nbdkit (apt) and a release build
# (cargo build --release -p stria). Env: STRIA (binary), SIZE (working set, 1g), RT (seconds, 10),
# READ_CACHE (Stria's read cache, 2G: nbdkit reads through the kernel's page cache, which holds
# the whole working set on this machine, so Stria gets a cache that can hold it too).
set -u
S=${STRIA:-$(dirname "$0")/../target/release/stria}
SIZE=${SIZE:-1g} RT=${RT:-10} READ_CACHE=${READ_CACHE:-2G}
for tool in fio nbdkit; do
  command -v $tool >/dev/null || { echo "bench-nbd: $tool is missing: apt-get install -y $tool" >&2; exit 1; }
done
fio --enghelp 2>/dev/null | grep -qx '[[:space:]]*nbd' || { echo "bench-nbd: this fio has no nbd engine" >&2; exit 1; }
rows() {  # rows LABEL URI
  local label=$1 uri=$2
  for spec in "seqwrite write 1m 8" "seqread read 1m 8" "randwrite randwrite 4k 32" "randread randread 4k 32"; do
    set -- $spec
    local name=$1 rw=$2 bs=$3 qd=$4 extra=""
    [ "$name" = seqwrite ] && extra="--end_fsync=1" || extra="--time_based --runtime=$RT"
    out=$(fio --name=$name --ioengine=nbd --uri="$uri" --rw=$rw --bs=$bs --iodepth=$qd --size=$SIZE $extra --output-format=json 2>/dev/null | sed -n '/^{/,$p')
    python3 - "$label" "$name" "$out" <<'PY'
import json,sys
label,name,out=sys.argv[1:4]
j=json.loads(out)["jobs"][0]
r=j["read"] if "read" in name else j["write"]
print(f"label={label} row={name} MBps={r['bw_bytes']/1e6:.1f} iops={r['iops']:.0f} err={j['error']}")
PY
  done
}
stria_rows() {  # stria_rows LEVEL DRIVES
  local level=$1 drives=$2 data=/var/tmp/nb-$1
  rm -rf $data; mkdir -p $data
  $S up --data $data --drives $drives --raid $level --drive-size 4G --no-mount --meta-listen 127.0.0.1:0 \
     --storage-listen 127.0.0.1:0 --mgmt-listen 127.0.0.1:0 --nbd-listen 127.0.0.1:0 --read-cache $READ_CACHE > $data.out 2>&1 &
  local pid=$!
  for i in $(seq 1 100); do [ -f $data/run.json ] && break; sleep 0.2; done
  $S volume create v --size 2G --data $data >/dev/null && $S export add v --data $data >/dev/null && \
    $S initiator allow v 127.0.0.1 --data $data >/dev/null
  addr=$(python3 -c "import json;print(json.load(open('$data/run.json'))['nbd'])")
  rows "stria-raid$level-x$drives" "nbd://$addr/v"
  kill -TERM $pid; wait $pid; rm -rf $data
}
nbdkit_rows() {  # nbdkit_rows LABEL [file plugin params]
  local label=$1; shift
  local f=/var/tmp/nb-nbdkit.img
  rm -f $f; truncate -s 2G $f
  nbdkit -f -p 10877 -i 127.0.0.1 file $f "$@" > /dev/null 2>&1 &
  local pid=$!; sleep 1
  kill -0 $pid 2>/dev/null || { echo "bench-nbd: nbdkit did not start" >&2; exit 1; }
  rows $label "nbd://127.0.0.1:10877"
  kill $pid; wait $pid 2>/dev/null; rm -f $f
}
stria_rows 0 5
nbdkit_rows nbdkit-file
stria_rows 6 6
nbdkit_rows nbdkit-file-cache-none cache=none
stria_rows 0 12
stria_rows 6 12
