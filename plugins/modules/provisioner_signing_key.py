#!/usr/bin/python
# -*- coding: utf-8 -*-
"""provisioner_signing_key: an apt repository's signing key, fetched and installed only when every key in it has a
pinned OpenPGP fingerprint.

Why not ansible.builtin.get_url + a check after it: get_url writes the key where apt reads it before anything looks
at it; this module reads the key (the file on the node, else a fresh download) in memory, computes the fingerprints
itself (RFC 4880 / RFC 9580 packets, no gpg on the node) and writes it only when they are the pinned ones.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_signing_key
short_description: Install an apt repository key whose OpenPGP fingerprints are pinned
description:
  - Keeps I(dest) when it exists, holds only keys whose primary fingerprints are in I(fingerprints) and matches
    I(checksum) (when given). Otherwise downloads I(url) (proxy and CA from the environment, TLS verified), checks the
    download the same way and writes it atomically (mode 0644, root).
  - Fails, naming I(var), when the key (on the node or downloaded) has another fingerprint; an existing I(dest) that
    fails the pin is removed, so apt no longer trusts it.
  - Check mode reports what it would fetch or replace and never downloads.
options:
  url:
    description: Where the key is published (ASCII-armoured or binary OpenPGP public key).
    type: str
    required: true
  dest:
    description: The keyring file apt's Signed-By names (.asc armoured, .gpg binary: written as downloaded).
    type: path
    required: true
  fingerprints:
    description:
      - Accepted primary-key fingerprints (40 hex digits for v4 keys, 64 for v6; spaces ignored, any case).
        Every primary key in the file must be one of them.
    type: list
    elements: str
    required: true
  var:
    description: The inventory variable holding I(fingerprints), named in every message.
    type: str
    default: fingerprints
  checksum:
    description: Optional C(sha256:<hex>) of the key file as well.
    type: str
    default: ""
author: provisioner
"""

EXAMPLES = r"""
- name: Install the NVIDIA repository signing key (pinned)
  provisioner.gpu.provisioner_signing_key:
    url: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/3bf863cc.pub
    dest: /etc/apt/keyrings/nvidia-cuda.asc
    fingerprints: [EB693B3035CD5710E231E123A4B469963BF863CC]
    var: nvidia_repo_key_fingerprints
"""

RETURN = r"""
fingerprints:
  description: The primary-key fingerprints of the installed key (or of the key that was refused).
  type: list
  returned: always
resources:
  description: Drifted resources as [kind, name] pairs, for provisioner's drift report.
  type: list
  returned: always
"""

import base64
import hashlib
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url

MAX_KEY_BYTES = 1 << 20  # a repository key is a few KiB; more is not a key
_ARMOR = re.compile(rb"-----BEGIN PGP PUBLIC KEY BLOCK-----\r?\n(.*?)-----END PGP PUBLIC KEY BLOCK-----", re.S)
_HEX = re.compile(r"[0-9A-F]{40}|[0-9A-F]{64}")


class NotAKey(ValueError):
    """Not an OpenPGP public key (the message says why)."""


def dearmor(data):
    """The binary packets of `data`: binary as is, ASCII armour (one block or several) decoded."""
    blocks = _ARMOR.findall(data)
    if not blocks:
        if data.lstrip().startswith(b"-----BEGIN"):
            raise NotAKey("armoured, but no PGP PUBLIC KEY BLOCK in it")
        return data
    out = b""
    for block in blocks:
        lines = block.replace(b"\r", b"").split(b"\n")
        if b"" in lines:  # armour headers (Version:, Comment:) end at the first blank line
            first_blank = lines.index(b"")
            if any(b":" in ln for ln in lines[:first_blank]):
                lines = lines[first_blank + 1:]
        body = b"".join(ln.strip() for ln in lines if ln.strip() and not ln.startswith(b"="))
        try:
            out += base64.b64decode(body, validate=True)
        except ValueError:
            raise NotAKey("the armour is not valid base64") from None
    return out


def packets(data):
    """(tag, body) of each OpenPGP packet (RFC 9580 section 4.2: old and new header formats)."""
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if not b & 0x80:
            raise NotAKey(f"byte {i} is not a packet header")
        if b & 0x40:  # new format
            tag = b & 0x3F
            if i + 1 >= n:
                raise NotAKey("truncated packet header")
            o1 = data[i + 1]
            if o1 < 192:
                length, i = o1, i + 2
            elif o1 < 224:
                if i + 2 >= n:
                    raise NotAKey("truncated packet header")
                length, i = ((o1 - 192) << 8) + data[i + 2] + 192, i + 3
            elif o1 == 255:
                if i + 5 >= n:
                    raise NotAKey("truncated packet header")
                length, i = int.from_bytes(data[i + 2:i + 6], "big"), i + 6
            else:
                raise NotAKey("partial body lengths do not occur in a public key")
        else:  # old format
            tag, ltype = (b >> 2) & 0x0F, b & 0x03
            if ltype == 3:
                length, i = n - i - 1, i + 1
            else:
                size = (1, 2, 4)[ltype]
                if i + size >= n:
                    raise NotAKey("truncated packet header")
                length, i = int.from_bytes(data[i + 1:i + 1 + size], "big"), i + 1 + size
        if i + length > n:
            raise NotAKey("truncated packet")
        yield tag, data[i:i + length]
        i += length


def fingerprint(body):
    """The fingerprint of a public-key packet body (v4: SHA-1, v5/v6: SHA-256), upper-case hex."""
    version = body[0] if body else 0
    if version == 4:
        return hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()  # noqa: S324 (RFC)
    if version in (5, 6):
        prefix = b"\x9a" if version == 5 else b"\x9b"
        return hashlib.sha256(prefix + len(body).to_bytes(4, "big") + body).hexdigest().upper()
    raise NotAKey(f"a version {version} key (only v4, v5 and v6 keys have fingerprints that can be pinned)")


def key_fingerprints(data):
    """Fingerprints of the primary keys (tag 6) in an armoured or binary OpenPGP public key file, in file order."""
    found = [fingerprint(body) for tag, body in packets(dearmor(data)) if tag == 6]
    if not found:
        raise NotAKey("no OpenPGP public key in it")
    return found


def normalize(fp):
    return re.sub(r"\s+", "", str(fp)).upper().removeprefix("0X")


def problem(data, allowed, checksum):
    """Why `data` is not the pinned key (None: it is); also returns its fingerprints ([] when unreadable)."""
    try:
        fps = key_fingerprints(data)
    except NotAKey as exc:
        return f"is not an OpenPGP public key ({exc})", []
    other = [f for f in fps if f not in allowed]
    if other:
        return f"holds key {', '.join(other)}, not one of the pinned {', '.join(sorted(allowed))}", fps
    if checksum:
        algo, _, want = checksum.partition(":")
        if algo != "sha256" or hashlib.sha256(data).hexdigest() != want.lower():
            return f"does not match checksum {checksum}", fps
    return None, fps


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            dest=dict(type="path", required=True),
            fingerprints=dict(type="list", elements="str", required=True),
            var=dict(type="str", default="fingerprints"),
            checksum=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    var, dest, url = p["var"], p["dest"], p["url"]
    allowed = {normalize(f) for f in p["fingerprints"] if normalize(f)}
    bad = sorted(f for f in allowed if not _HEX.fullmatch(f))
    if not allowed:
        module.fail_json(msg=f"{var} is empty: set it to the OpenPGP fingerprint(s) of the key that signs the "
                             f"repository ({url}); a repository key is never installed unpinned",
                         fingerprints=[], resources=[])
    if bad:
        module.fail_json(msg=f"{var} = {p['fingerprints']!r}: expected a list of OpenPGP fingerprints (40 hex digits, "
                             f"64 for a v6 key) of the keys that sign the repository", fingerprints=[], resources=[])
    if p["checksum"] and not re.fullmatch(r"sha256:[0-9a-fA-F]{64}", p["checksum"]):
        module.fail_json(msg=f"checksum {p['checksum']!r}: expected sha256:<64 hex digits>", fingerprints=[],
                         resources=[])

    removed = ""
    if os.path.isfile(dest):
        with open(dest, "rb") as fh:
            current = fh.read(MAX_KEY_BYTES + 1)
        why, fps = problem(current, allowed, p["checksum"])
        if why is None:
            module.exit_json(changed=False, fingerprints=fps, resources=[])
        if module.check_mode:
            module.exit_json(changed=True, fingerprints=fps, resources=[["file", dest]],
                             msg=f"{dest} {why} ({var}): a run replaces it from {url}")
        os.unlink(dest)  # apt must not trust a key that fails the pin, whatever happens next
        removed = f" ({dest}, which {why}, was removed)"
    elif module.check_mode:
        module.exit_json(changed=True, fingerprints=[], resources=[["file", dest]])

    resp, info = fetch_url(module, url, method="GET", timeout=60)
    if info.get("status") != 200 or resp is None:
        module.fail_json(msg=f"cannot download the repository key {url}: {info.get('msg', '')} "
                             f"(HTTP {info.get('status')}){removed}", fingerprints=[], resources=[["file", dest]])
    data = resp.read(MAX_KEY_BYTES + 1)
    if len(data) > MAX_KEY_BYTES:
        module.fail_json(msg=f"{url} is larger than {MAX_KEY_BYTES} bytes: not a repository key{removed}",
                         fingerprints=[], resources=[["file", dest]])
    why, fps = problem(data, allowed, p["checksum"])
    if why is not None:
        module.fail_json(msg=f"refusing the repository key from {url}: it {why}. Check the mirror; when the key "
                             f"was rotated on purpose, set {var} to the new fingerprint{removed}",
                         fingerprints=fps, resources=[["file", dest]])
    directory = os.path.dirname(dest) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(dest) + ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        if os.geteuid() == 0:
            os.chown(tmp, 0, 0)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    module.exit_json(changed=True, fingerprints=fps, resources=[["file", dest]])


if __name__ == "__main__":
    main()
