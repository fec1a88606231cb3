#!/usr/bin/env bash
# A rank killed mid-step: the other rank exits non-zero with an error naming the lost rank, and
# the last completed checkpoint still loads (kiln sample reads it; a single-process --resume
# continues from it).
#   tests/scripts/test_dist_kill.sh KILN_BINARY MPIRUN [kill|stall]
# stall: rank 1 is stopped (SIGSTOP) instead: alive but silent, so only the collective deadline
# (KILN_DIST_TIMEOUT_S, 20 s here: ample for a step of this tiny model on a loaded 2-core machine)
# can end rank 0, with an error that says so and names rank 1.
# Nothing here is timed: each wait lasts until its event happens, with only a guard against a
# hang (GUARD_S, under ctest's TIMEOUT), whose failure says the event never came.
# mpirun normally ends the whole job itself when a rank dies; orte_enable_recovery keeps it from
# doing so, so that this tests kiln's own detection (the one other launchers and hosts rely on).
# Each rank runs under sh, which records its exit status in rc.<rank>.
set -euo pipefail
KILN=$(realpath "$1")
MPIRUN=$2
MODE=${3:-kill}
[[ $MODE == kill || $MODE == stall ]] || { echo "mode must be kill or stall"; exit 2; }
[[ $MODE == stall ]] && export KILN_DIST_TIMEOUT_S=20
GUARD_S=${GUARD_S:-170}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
dir=$(mktemp -d /tmp/kiln_test_dist_kill.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
awk 'BEGIN { srand(3); split("the king and queen of rome said, now.", w, " ");
             for (i = 0; i < 6000; i++) printf "%s%s", w[int(rand() * 8) + 1], (i % 12 == 11 ? "\n" : " ") }' > data.txt

"$MPIRUN" -np 2 --oversubscribe --allow-run-as-root --bind-to none --mca orte_enable_recovery 1 \
  sh -c '"$0" "$@"; echo $? > rc.$OMPI_COMM_WORLD_RANK' \
  "$KILN" train --data data.txt --preset stories260K --batch 4 --seq 32 --steps 1000000 \
  --ckpt-interval 20 --eval-interval 0 --log-interval 10 --threads 1 --progress 0 --out run \
  > log.txt 2>&1 &
launcher=$!

fail() {
  echo "FAIL: $*"
  echo "---- log"; cat log.txt
  kill -9 "$launcher" 2>/dev/null || true
  exit 1
}

# Wait for the first checkpoint, then for a few more steps, so the kill lands mid-run.
start=$SECONDS
until [[ -f run/ckpt.h5 ]] && grep -q "^step 30/" log.txt; do
  kill -0 "$launcher" 2>/dev/null || fail "the job ended before the kill"
  ((SECONDS - start < GUARD_S)) || fail "hang guard: no checkpoint and step 30 yet"
  sleep 0.1
done

victim=""
for sh_pid in $(pgrep -P "$launcher"); do
  if tr '\0' '\n' < "/proc/$sh_pid/environ" | grep -qx OMPI_COMM_WORLD_RANK=1; then
    victim=$(pgrep -P "$sh_pid" || true)
  fi
done
[[ -n "$victim" ]] || fail "rank 1's process not found under mpirun (pid $launcher)"
if [[ $MODE == kill ]]; then kill -9 "$victim"; else kill -STOP "$victim"; fi
killed_at=$(date +%s)

start=$SECONDS
while kill -0 "$launcher" 2>/dev/null; do
  [[ $MODE == stall && -f rc.0 ]] && break  # rank 0 is done; rank 1 stays stopped
  if ((SECONDS - start >= GUARD_S)); then
    [[ $MODE == stall ]] && kill -9 "$victim"
    fail "hang guard: rank 0 never ended after rank 1 was ${MODE}ed"
  fi
  sleep 0.1
done
[[ $MODE == stall ]] && kill -9 "$victim"  # the stopped rank, by its pid
wait "$launcher" || true
took=$(( $(date +%s) - killed_at ))

[[ -f rc.0 ]] || fail "rank 0 left no exit status"
[[ $(cat rc.0) != 0 ]] || fail "rank 0 exited 0 after losing rank 1"
if [[ $MODE == kill ]]; then
  grep -q "error: \[dist\] lost rank 1 (pid $victim" log.txt || fail "no error naming rank 1"
  echo "rank 0 exited $(cat rc.0) ${took} s after rank 1 (pid $victim) was killed:"
  grep "lost rank 1" log.txt
else
  grep -q "did not complete within 20 s (KILN_DIST_TIMEOUT_S): a peer stalled or was lost. Alive on this host: rank 1 (pid $victim" log.txt ||
    fail "no deadline error naming rank 1"
  echo "rank 0 exited $(cat rc.0) ${took} s after rank 1 (pid $victim) was stopped:"
  grep "did not complete" log.txt
fi

# The last completed checkpoint is intact: it samples and resumes (one process, same format).
"$KILN" sample --ckpt run/ckpt.h5 --prompt "the " --max-new-tokens 8 --temperature 0 \
  > sample.txt 2>&1 || fail "kiln sample cannot read the checkpoint: $(cat sample.txt)"
"$KILN" train --data data.txt --resume --out run --steps 1000000 --stop-at 41 --batch 4 --seq 32 \
  --preset stories260K --eval-interval 0 --threads 1 --progress 0 > resume.txt 2>&1 ||
  fail "single-process resume failed: $(cat resume.txt)"
grep -q "resumed from run/ckpt.h5 at step" resume.txt || fail "no resume line: $(cat resume.txt)"
grep "resumed from" resume.txt
echo PASS
