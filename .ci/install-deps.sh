#!/usr/bin/env bash
# Install the Debian/Ubuntu packages the suite needs (idempotent: a no-op when all are present).
#   testbed hosts:      debootstrap systemd-container tinyproxy iproute2 nftables
#   stand-in NVIDIA repo: dpkg-dev apt-utils gnupg gpgv fakeroot
#   serving edge tests: nginx-light + libnginx-mod-http-js (njs model routing), prometheus (promtool),
#   prometheus-alertmanager (the alert receiver test: a real Alertmanager, amtool)
#   ledger tests:       postgresql (the server the PostgreSQL ledger test starts; libpq for psycopg)
#   status page test:   chromium-headless-shell (screenshots the `provision status --html` page)
#   tools:              make rsync procps psmisc openssh-client curl
set -euo pipefail
PKGS=(debootstrap systemd-container tinyproxy iproute2 nftables
      dpkg-dev apt-utils gnupg gpgv fakeroot
      nginx-light libnginx-mod-http-js prometheus prometheus-alertmanager postgresql chromium-headless-shell
      make rsync procps psmisc openssh-client curl ca-certificates)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "installing: ${missing[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine's unattended-upgrades holds the dpkg lock for minutes: wait for it (bounded: APT_LOCK_WAIT s).
# shellcheck source=.ci/apt-wait.sh
. "$(dirname "$0")/apt-wait.sh"
apt_wait
$SUDO apt-get "${APT_LOCK_OPTS[@]}" update -qq
# policy-rc.d keeps the packaged daemons (nginx, prometheus, tinyproxy) from starting: the suite starts its own.
printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null; $SUDO chmod +x /usr/sbin/policy-rc.d
trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
apt_wait
$SUDO apt-get "${APT_LOCK_OPTS[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
