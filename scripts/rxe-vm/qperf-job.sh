#!/bin/bash
# A job for run-rxe-vm.sh (runs inside the rxe VM as /mnt/host/job.sh, cwd /mnt/host):
# what Debian's qperf does on the kernel's soft-RoCE driver (rxe0), to compare with the
# emulator's qperf rows in capi/README.md. One qperf server; clients against the VM's
# own address: rc_bw with -cm1 (the control), then uc_bw, ud_bw, ud_lat with -cm1 and
# without it, each under `timeout 30`. Every command, its exit status and its whole
# output go to the log, copied to /mnt/host/results/qperf-rxe.log. Exit status 0 when
# the job ran through (the tests' own results are in the log).
#   W=/work/rxevm-cache TIMEOUT=300 flock /tmp/rxe-vm.lock \
#     scripts/rxe-vm/run-rxe-vm.sh scripts/rxe-vm/qperf-job.sh
ulimit -l unlimited
LOG=/tmp/qperf-rxe.log
IP=$(ip -4 -o addr show dev eth0 | awk '{sub(/\/.*/, "", $4); print $4; exit}')
{
  echo "kernel: $(uname -r)"
  echo "qperf: $(dpkg-query -W -f='${Version}' qperf 2>/dev/null)"
  rdma link show
  ibv_devinfo -d rxe0 | grep -E 'hca_id|transport|link_layer|state|port_lid'
  echo "address: $IP"
} > "$LOG" 2>&1
qperf > /tmp/qperf.srv 2>&1 &
srv=$!
sleep 1
run() {
  echo "=== \$ timeout 30 qperf $*"
  timeout 30 qperf "$@" > /tmp/qperf.out 2>&1
  local rc=$?
  cat /tmp/qperf.out
  echo "=== exit $rc"
  echo
}
{
  run -cm1 -t 2 "$IP" rc_bw
  for t in uc_bw ud_bw ud_lat; do run -cm1 -t 2 "$IP" "$t"; done
  for t in uc_bw ud_bw ud_lat; do run -t 2 "$IP" "$t"; done
  # Not asked for by the qperf rows, for comparison: RC without the CM (LID addressing).
  run -t 2 "$IP" rc_bw
} >> "$LOG" 2>&1
kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
{
  echo "=== qperf server output:"
  cat /tmp/qperf.srv
  echo "=== kernel messages:"
  dmesg | grep -iE 'rxe|rdma' | tail -20
} >> "$LOG" 2>&1
cat "$LOG"
mkdir -p /mnt/host/results
cp "$LOG" /mnt/host/results/qperf-rxe.log
