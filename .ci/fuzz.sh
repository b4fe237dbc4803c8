#!/usr/bin/env bash
# Fuzzing: builds tests/fuzz/fuzz_rms_norm.c with the kernels of csrc/kernels
# under libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer, and runs it
# for a bounded time. Any crash, sanitizer report, leak or wrong result (the
# harness checks against its own long double reference) fails the step; the
# input that did it is kept and its path printed.
#
#   FUZZ_SECONDS   how long to fuzz (default 60)
#   CLANG          the compiler (default: clang, installed with apt if missing)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-60}"
clang="${CLANG:-clang}"

if ! command -v "$clang" >/dev/null; then
    echo "+ apt-get install clang (for libFuzzer)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq clang >/dev/null
fi

build="$(mktemp -d -t rmsnorm-fuzz.XXXXXX)"
keep_build=0
cleanup() { if [ "$keep_build" = 0 ]; then rm -rf "$build"; fi; }
trap cleanup EXIT

# -g1: line tables, enough for a report's stack, and cheaper to compile than
# full debug information. Coverage without comparison tracing: the kernels'
# and the checks' inner loops would spend most of the time in it, and the
# inputs steer the harness through a few header bytes that plain coverage
# finds well enough. RMS_NO_FORCED_INLINE: see csrc/kernels/simd/common.h.
flags=(-g1 -O1 -std=c11 -pthread -ffp-contract=off -fno-math-errno
       -fsanitize=address,undefined -fno-sanitize-recover=undefined
       -fno-sanitize-coverage=trace-cmp -DRMS_NO_FORCED_INLINE)

# One compiler per kernel file at a time, side by side.
pids=()
for source in csrc/kernels/*.c; do
    name="$(basename "$source" .c)"
    "$clang" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$source" -o "$build/$name.o" &
    pids+=("$!")
done
for pid in "${pids[@]}"; do
    wait "$pid"
done
"$clang" "${flags[@]}" -fsanitize=fuzzer -Wall -Wextra tests/fuzz/fuzz_rms_norm.c \
    "$build"/*.o -lm -o "$build/fuzz_rms_norm"

mkdir -p "$build/corpus" "$build/artifacts"
# Seeds: 64 pseudo-random inputs of 5 to 3000 bytes (fixed, so every run
# starts from the same place), each a whole problem with its values, and
# tests/fuzz/regressions: inputs that once failed, each kept after its fix
# and named after what it found (read only: new inputs go to the first
# directory).
for i in $(seq 1 64); do
    LC_ALL=C awk -v seed="$i" 'BEGIN { srand(seed); n = 5 + int(rand() * 2995);
        for (k = 0; k < n; k++) printf "%c", int(rand() * 256) }' >"$build/corpus/seed-$i"
done
echo "+ [${SECONDS}s] fuzz_rms_norm for ${seconds} s"
status=0
ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:allocator_may_return_null=1" \
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    "$build/fuzz_rms_norm" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
    -max_len=4096 -len_control=0 -print_final_stats=1 -artifact_prefix="$build/artifacts/" \
    "$build/corpus" tests/fuzz/regressions >"$build/fuzz.log" 2>&1 || status=$?
grep -E "^(INFO: Seed|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|stat::peak_rss_mb|Done )" \
    "$build/fuzz.log" || true
if [ "$status" -ne 0 ]; then
    keep_build=1
    grep -v -E "^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|RELOAD)|^[[:space:]]+NEW_FUNC" \
        "$build/fuzz.log" | tail -60
    echo "fuzzing failed (exit $status); inputs kept in $build/artifacts:" >&2
    ls -l "$build/artifacts" >&2
    echo "reproduce: $build/fuzz_rms_norm $build/artifacts/<file>" >&2
    exit 1
fi
echo "fuzzing: no crash, no sanitizer report, no wrong result (${SECONDS}s)"
