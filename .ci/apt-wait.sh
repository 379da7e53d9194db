#!/usr/bin/env bash
# Sourced by .ci/install-deps.sh: wait (bounded) while another apt/dpkg holds its locks, as a freshly started
# Ubuntu machine's unattended-upgrades / apt-daily does for minutes after boot. apt-get alone fails at once.
#   apt_wait [SECONDS]   waits up to SECONDS (default $APT_LOCK_WAIT, else 600) for every lock in $APT_LOCK_FILES
#                        to be free; prints one line when it has to wait (who holds what), returns 1 on timeout.
#   APT_LOCK_OPTS        the same bound for apt-get itself (-o DPkg::Lock::Timeout=...), for the moment between
#                        our check and apt-get taking the lock (apt >= 1.9.11; older apt ignores it).
APT_LOCK_WAIT=${APT_LOCK_WAIT:-600}
APT_LOCK_FILES=${APT_LOCK_FILES:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock}
APT_LOCK_OPTS=(-o "DPkg::Lock::Timeout=$APT_LOCK_WAIT")

# "PID FILE" of the first lock held (a POSIX lock in /proc/locks on that file's inode), nothing when all are free
apt_lock_holder() {
  local f ino pid
  for f in $APT_LOCK_FILES; do
    ino=$(stat -c %i "$f" 2>/dev/null) || continue
    pid=$(awk -v ino="$ino" '{ n = split($6, d, ":"); if (d[n] == ino) { print $5; exit } }' /proc/locks)
    [ -n "$pid" ] && [ "$pid" != "$$" ] && { echo "$pid $f"; return 0; }
  done
  return 0
}

apt_wait() {
  local bound=${1:-$APT_LOCK_WAIT} t0 held said=""
  t0=$(date +%s)
  while held=$(apt_lock_holder) && [ -n "$held" ]; do
    if [ -z "$said" ]; then
      echo "waiting for $(ps -o comm= -p "${held%% *}" 2>/dev/null || echo '?') (pid ${held%% *}) to release" \
           "${held#* } (another apt/dpkg; up to ${bound}s)"
      said=1
    fi
    if [ $(( $(date +%s) - t0 )) -ge "$bound" ]; then
      echo "error: ${held#* } still held by pid ${held%% *} after ${bound}s: let it finish, then run make deps again" >&2
      return 1
    fi
    sleep 1
  done
  return 0
}
