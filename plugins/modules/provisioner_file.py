#!/usr/bin/python
# -*- coding: utf-8 -*-
"""provisioner_file: one managed file (content, owner, group, mode) in one module run.

Why not ansible.builtin.copy/template: each of those costs five SSH executions per host (the remote home, a
temporary directory, a stat, the file module, removing the directory) even when the file is already right; this
module compares and writes in one. Its action plugin renders `src` on the controller. benchmarks/README.md has the
measurements.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_file
short_description: Manage one file's content, owner, group and mode in one module run
description:
  - Compares I(content) with the file at I(dest) and writes it (a temporary file in the same directory, checked with
    I(validate), then renamed over I(dest)) only when it differs.
  - Sets owner, group and mode when they differ.
  - The action plugin renders I(src) (a Jinja template, found like ansible.builtin.template's C(src)) on the
    controller into I(content); give one of the two.
  - Supports check mode and diff mode; the result lists the drifted resource (C(resources)).
options:
  dest:
    description: Absolute path of the file on the host.
    type: path
    required: true
  content:
    description: The file's full content (text). The action plugin fills it from I(src).
    type: str
  src:
    description: A template (in the role's C(templates/), or a path) rendered on the controller with the host's
      variables, as ansible.builtin.template does (C(trim_blocks), no C(lstrip_blocks), C(\n) line ends).
    type: str
  validate:
    description: Command that checks the new file before it replaces I(dest); C(%s) is the new file's path.
    type: str
  parent_mode:
    description:
      - Also manage the directory of I(dest) (one level): created when missing, with this mode and the file's
        I(owner) and I(group), which are set when they differ. Omit to leave the directory alone (it must exist).
    type: raw
extends_documentation_fragment:
  - ansible.builtin.files
author: provisioner
"""

EXAMPLES = r"""
- name: Render /etc/nccl.conf
  provisioner.gpu.provisioner_file:
    src: nccl.conf.j2
    dest: /etc/nccl.conf
    owner: root
    group: root
    mode: "0644"
"""

RETURN = r"""
dest:
  description: The managed file.
  type: str
  returned: always
checksum:
  description: SHA-1 of the content (as ansible.builtin.copy reports it).
  type: str
  returned: always
resources:
  description: Drifted resources as [kind, name] pairs ([[file, dest]] when anything differed), for provisioner's
    drift report.
  type: list
  returned: always
"""

import hashlib
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

#: Longest previous content shown in a diff (ansible-core's own limit for file diffs).
MAX_DIFF = 104448


def _before(data):
    """The previous content as diff text, or a short note when it cannot be shown."""
    if data is None:
        return ""
    if len(data) > MAX_DIFF:
        return "(%d bytes, longer than the diff shows)\n" % len(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "(binary content, %d bytes)\n" % len(data)


def _write(module, dest, data, validate):
    """Write `data` beside `dest`, validate it, rename it over `dest`."""
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(dest), dir=os.path.dirname(dest) or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if validate:
            if "%s" not in validate:
                module.fail_json(msg="validate must contain %%s: %s" % validate)
            rc, out, err = module.run_command(validate % tmp)
            if rc != 0:
                module.fail_json(msg="failed to validate %s" % dest, rc=rc, stdout=out, stderr=err)
        module.atomic_move(tmp, dest, unsafe_writes=module.params["unsafe_writes"])
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _parent(module, parent, diffs, result):
    """Create `parent` when missing and set its mode, owner and group (parent_mode, owner, group); whether it changed."""
    p = module.params
    args = module.load_file_common_arguments(dict(p, mode=p["parent_mode"], attributes=None), path=parent)
    changed = False
    if not os.path.isdir(parent):
        if os.path.lexists(parent):
            module.fail_json(msg="%s exists and is not a directory" % parent, **result)
        diffs.append(dict(before={"path": parent, "state": "absent"}, after={"path": parent, "state": "directory"},
                          before_header=parent, after_header=parent))
        result["resources"].append(["file", parent])
        if module.check_mode:
            return True
        os.makedirs(parent)
        changed = True
    d = dict(before={}, after={})
    changed = module.set_fs_attributes_if_different(args, changed, diff=d)
    if d["before"] or d["after"]:
        d.update(before_header="%s (attributes)" % parent, after_header="%s (attributes)" % parent)
        diffs.append(d)
        if ["file", parent] not in result["resources"]:
            result["resources"].append(["file", parent])
    return changed


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            content=dict(type="str", required=True),
            src=dict(type="str"),
            validate=dict(type="str"),
            parent_mode=dict(type="raw"),
        ),
        add_file_common_args=True,
        supports_check_mode=True,
    )
    p = module.params
    dest, data = p["dest"], p["content"].encode("utf-8")
    result = dict(changed=False, dest=dest, checksum=hashlib.sha1(data).hexdigest(), resources=[])
    if os.path.isdir(dest):
        module.fail_json(msg="%s is a directory" % dest, **result)
    parent = os.path.dirname(dest)
    diffs = []
    changed = False
    if p["parent_mode"] is not None and parent:
        changed = _parent(module, parent, diffs, result)
    elif parent and not os.path.isdir(parent) and not module.check_mode:
        module.fail_json(msg="the directory of %s does not exist" % dest, **result)
    old = None
    if os.path.lexists(dest):
        try:
            with open(dest, "rb") as f:
                old = f.read()
        except OSError as e:
            module.fail_json(msg="cannot read %s: %s" % (dest, e), **result)
    content_changed = old != data
    if content_changed:
        diffs.append(dict(before=_before(old), after=p["content"], before_header=dest, after_header=p["src"] or dest))
        if not module.check_mode:
            _write(module, dest, data, p["validate"])
    attr_diff = dict(before={}, after={})
    changed = changed or content_changed
    if content_changed:
        result["resources"].append(["file", dest])
    if os.path.exists(dest):
        changed = module.set_fs_attributes_if_different(module.load_file_common_arguments(p, path=dest), changed,
                                                        diff=attr_diff)
    if attr_diff["before"] or attr_diff["after"]:
        attr_diff.update(before_header="%s (attributes)" % dest, after_header="%s (attributes)" % dest)
        diffs.append(attr_diff)
    if (attr_diff["before"] or attr_diff["after"]) and ["file", dest] not in result["resources"]:
        result["resources"].append(["file", dest])
    result["changed"] = changed
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
