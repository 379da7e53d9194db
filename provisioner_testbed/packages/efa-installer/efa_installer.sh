#!/bin/bash
# Stand-in EFA installer (provisioner testbed): the real aws-efa-installer's efa_installer.sh builds the efa kernel
# module and installs libfabric, rdma-core and aws-ofi-nccl from the .debs in its tarball. This one installs the
# stand-in .debs of this tarball (libfabric1-aws with fi_info, libnccl-ofi, efa-config) with dpkg, records what it
# installed in /opt/amazon/efa_installed_packages (the real installer's version file) and, unless --no-verify,
# checks that fi_info lists an EFA device. The simulated node's EFA devices come from its hardware spec.
set -euo pipefail
VERSION="@UPSTREAM@"
here="$(cd "$(dirname "$0")" && pwd)"
yes=0 verify=1 skip_kmod=0 skip_limit=0
usage() {
    echo "Usage: $0 [-y|--yes] [-k|--skip-kmod] [-l|--skip-limit-conf] [-n|--no-verify] [-h|--help]"
}
while [ $# -gt 0 ]; do
    case "$1" in
        -y|--yes) yes=1 ;;
        -k|--skip-kmod) skip_kmod=1 ;;
        -l|--skip-limit-conf) skip_limit=1 ;;
        -n|--no-verify) verify=0 ;;
        -g|--enable-gdr|-d|--debug-packages|-m|--mpi=*) ;;  # accepted, nothing to do in the stand-in
        -h|--help) usage; exit 0 ;;
        *) echo "Unknown option: $1" >&2; usage >&2; exit 1 ;;
    esac
    shift
done
if [ "$(id -u)" -ne 0 ]; then
    echo "Error: efa_installer.sh must be run as root" >&2
    exit 1
fi
if [ "$yes" -ne 1 ]; then
    echo "Error: run with -y (non-interactive) in the testbed stand-in" >&2
    exit 1
fi
echo "== Installing EFA packages (stand-in EFA installer ${VERSION}) =="
debs=("$here"/DEBS/*.deb)
if [ "$skip_limit" -eq 1 ]; then
    debs=()
    for d in "$here"/DEBS/*.deb; do
        case "$(basename "$d")" in efa-config_*) ;; *) debs+=("$d") ;; esac
    done
fi
dpkg -i "${debs[@]}"
[ "$skip_kmod" -eq 1 ] && echo "Skipping the efa kernel module (--skip-kmod)"
{
    echo "# EFA installer version: ${VERSION}"
    echo "# Debug packages installed: no"
    echo "# Packages installed:"
    for d in "${debs[@]}"; do dpkg-deb --show --showformat='${Package}_${Version}\n' "$d"; done
} > /opt/amazon/efa_installed_packages.tmp
mv /opt/amazon/efa_installed_packages.tmp /opt/amazon/efa_installed_packages
if [ "$verify" -eq 1 ]; then
    if ! /opt/amazon/efa/bin/fi_info -p efa >/dev/null; then
        echo "Error: no EFA device found by fi_info -p efa (is this an EFA-enabled instance?)" >&2
        exit 1
    fi
fi
echo "===================================================="
echo "EFA installation complete."
echo "- Please logout/login to complete the installation."
echo "- Libfabric was installed in /opt/amazon/efa"
echo "- aws-ofi-nccl was installed in /opt/amazon/ofi-nccl"
echo "===================================================="
