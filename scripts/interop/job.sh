#!/bin/bash
# The job scripts/ci-interop.sh runs inside the rxe VM (NET=tap: guest 192.168.77.2,
# host 192.168.77.1): prints rxe0's GIDs, then serves the host's commands through the
# interop agent until the host sends "exit". Exit status: the agent's.
ulimit -l unlimited
uname -r
rdma link show
ibv_devinfo -d rxe0 -v | grep -E 'GID\[|active_mtu'
ip -br addr show
exec ./bin/interop agent 192.168.77.2:7000
