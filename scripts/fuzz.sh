#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets/) for SECONDS_PER_TARGET seconds each
# (default 60) on the nightly toolchain, starting from the committed corpus, and prints the
# executions, new corpus entries and crashes of each. Installs cargo-fuzz if it is missing.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Crashes land in fuzz/artifacts/<target>/; reproduce one with
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/crash-...
# New inputs libFuzzer finds go to a scratch corpus (not the committed one); minimise a
# useful one with `cargo +nightly fuzz cmin` before committing it. FUZZ_JOBS=N runs N
# processes per target; FUZZ_ARGS adds libFuzzer flags.
set -euo pipefail

cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
jobs="${FUZZ_JOBS:-1}"

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "installing cargo-fuzz..."
    cargo install cargo-fuzz --locked
fi
if ! rustc +nightly --version >/dev/null 2>&1; then
    echo "cargo-fuzz needs a nightly toolchain: rustup toolchain install nightly" >&2
    exit 1
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
fi

# A target directory of its own: sanitizer builds share nothing with the stable ones.
target_dir=()
if [ -n "${CARGO_TARGET_DIR:-}" ]; then target_dir=(--target-dir "$CARGO_TARGET_DIR/fuzz-nightly"); fi
cargo +nightly fuzz build --fuzz-dir fuzz "${target_dir[@]}"

parallel=()
if [ "$jobs" -gt 1 ]; then parallel=(-jobs="$jobs" -workers="$jobs"); fi
scratch="$(mktemp -d -t stria-fuzz-XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
summary=()
failed=0
for target in "${targets[@]}"; do
    echo "=== $target: ${seconds}s"
    mkdir -p "$scratch/$target" "fuzz/artifacts/$target"
    log="$scratch/$target.log"
    touch "$scratch/$target.started"
    start=$(date +%s)
    status=0
    # The scratch corpus comes first, so libFuzzer writes its finds there; the committed
    # corpus is read as seeds only.
    cargo +nightly fuzz run --fuzz-dir fuzz "${target_dir[@]}" "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
        "${parallel[@]}" ${FUZZ_ARGS:-} >"$log" 2>&1 || status=$?
    elapsed=$(( $(date +%s) - start ))
    # With -jobs, each worker logs to fuzz-N.log in the working directory.
    cat fuzz-*.log >>"$log" 2>/dev/null || true
    rm -f fuzz-*.log
    execs=$(grep -h "stat::number_of_executed_units" "$log" | awk '{s += $2} END {print s + 0}')
    found=$(find "$scratch/$target" -type f | wc -l)
    crashes=$(find "fuzz/artifacts/$target" -type f -newer "$scratch/$target.started" 2>/dev/null | wc -l)
    if [ "$status" -ne 0 ]; then
        failed=1
        tail -n 40 "$log"
    fi
    line="$target: ${execs} executions in ${elapsed}s, ${found} new corpus inputs, exit ${status}, ${crashes} crash files"
    echo "$line"
    summary+=("$line")
done

echo
echo "=== summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
exit "$failed"
