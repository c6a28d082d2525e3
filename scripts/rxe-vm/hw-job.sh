#!/bin/bash
# The job scripts/ci-hw.sh runs inside the rxe VM (as /mnt/host/job.sh, cwd /mnt/host):
# every hw-backend test binary in ./bin against rxe0, with REQUIRE_RDMA_DEVICE=1 so that
# a missing device fails instead of skipping. Each binary's libtest output goes to
# results/<name>.log; the host compares it with rxe-deviations.txt. Exit status: 0 when
# every binary ran to completion (tests may have failed), 2 when one hung or crashed.
export REQUIRE_RDMA_DEVICE=1 RDMA_DEVICE=rxe0 RUST_BACKTRACE=1
ulimit -l unlimited
uname -r
rdma link show
mkdir -p results
rc=0
for b in bin/*; do
  name=$(basename "$b")
  start=$(date +%s%N)
  timeout 300 "$b" --test-threads=1 > "results/$name.log" 2>&1
  brc=$?
  echo "$name: exit $brc in $(( ($(date +%s%N) - start) / 1000000 )) ms"
  grep -E '^test .* \.\.\. ' "results/$name.log"
  # libtest exits 101 when tests fail; anything else non-zero is a hang or a crash.
  if [ "$brc" -ne 0 ] && [ "$brc" -ne 101 ]; then
    echo "$name did not complete (exit $brc)"; tail -20 "results/$name.log"; rc=2
  fi
done
exit $rc
