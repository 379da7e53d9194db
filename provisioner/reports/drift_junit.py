"""Drift as JUnit XML for CI dashboards: one testcase per host x drifted resource (a failure), one passing testcase
for a host without drift, an error testcase for a host that could not be checked, a `reboot` failure for a host that
applying the playbooks would leave needing a reboot."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime

from provisioner.results import RunResult


def render(result: RunResult) -> str:
    suites = ET.Element("testsuites", name="provision drift")
    stamp = datetime.fromtimestamp(result.started, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    total = failures = errors = 0
    for name in sorted(result.hosts):
        h = result.hosts[name]
        suite = ET.SubElement(suites, "testsuite", name=name, timestamp=stamp, hostname=name)
        cases = fails = errs = 0
        if h.unreachable:
            tc = ET.SubElement(suite, "testcase", classname=name, name="reachable")
            el = ET.SubElement(tc, "error", message="host unreachable: drift not checked", type="unreachable")
            el.text = h.unreachable_message or ""
            cases, errs = cases + 1, errs + 1
        for f in h.failures:
            tc = ET.SubElement(suite, "testcase", classname=name, name=f"check: {f.task}")
            el = ET.SubElement(tc, "error", message="check task failed: drift incomplete", type="check_failed")
            el.text = f.message
            cases, errs = cases + 1, errs + 1
        for d in h.drift:
            tc = ET.SubElement(suite, "testcase", classname=f"{name}.{d.role or 'play'}", name=f"{d.kind}:{d.resource}")
            el = ET.SubElement(tc, "failure", message=f"{d.kind} {d.resource} drifted (task: {d.task})", type="drift")
            el.text = d.diff or f"{d.kind} {d.resource} differs from the playbooks (task: {d.task})"
            cases, fails = cases + 1, fails + 1
        if h.reboot_required:
            tc = ET.SubElement(suite, "testcase", classname=name, name="reboot")
            el = ET.SubElement(tc, "failure", message="applying would require a reboot", type="reboot_required")
            el.text = h.reboot_reason or ""
            cases, fails = cases + 1, fails + 1
        if not cases and h.state != "not_run":
            ET.SubElement(suite, "testcase", classname=name, name="no drift")
            cases = 1
        if h.state == "not_run" and not cases:
            tc = ET.SubElement(suite, "testcase", classname=name, name="checked")
            ET.SubElement(tc, "skipped", message="no play targeted this host")
            cases = 1
        suite.set("tests", str(cases))
        suite.set("failures", str(fails))
        suite.set("errors", str(errs))
        total, failures, errors = total + cases, failures + fails, errors + errs
    suites.set("tests", str(total))
    suites.set("failures", str(failures))
    suites.set("errors", str(errors))
    suites.set("time", f"{result.duration:.3f}")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
