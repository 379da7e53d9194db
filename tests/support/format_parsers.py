"""Readers of the rendered formats as their consumers read them, for the hostile-value corpus test.

Each mirrors its consumer's own parser where the tool itself offers no way to print what it parsed: systemd's unit
file reader (line based, `\\` continuation, `#`/`;` comments) and `extract_first_word` with EXTRACT_UNQUOTE |
EXTRACT_CUNESCAPE (ExecStart=), its EnvironmentFile reader (src/basic/env-file.c: a double-quoted value runs to the
next unescaped quote, newlines included), NCCL's nccl.conf reader (one KEY=VALUE a line, `#` comments), nginx's
tokenizer (words, quoted strings with `\\` escapes, `;`, `{`, `}`, `#` comments). The tools themselves
(`systemd-analyze verify`, `nginx -t`, `promtool check config`, `nft -c`) check the syntax beside them.
"""

from __future__ import annotations

import codecs
import re
from typing import Any


def unit_directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) in file order."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for raw in text.split("\n"):
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("[") and s.endswith("]"):
            section = s[1:-1]
            continue
        key, _, value = s.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


_C_ESC = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[abfnrtv\\\"'s])")


def _cunescape(s: str) -> str:
    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        return {"s": " "}.get(e, codecs.decode("\\" + e, "unicode_escape"))

    return _C_ESC.sub(one, s)


def exec_argv(value: str) -> list[str]:
    """An ExecStart= value as systemd splits it: words, double-quoted words C-unescaped; %% and $$ undone.
    An unquoted `;` word (systemd's command separator) is returned as the marker '<;>'."""
    words: list[str] = []
    i, n = 0, len(value)
    while i < n:
        if value[i].isspace():
            i += 1
            continue
        if value[i] == '"':
            j = i + 1
            while j < n and value[j] != '"':
                j += 2 if value[j] == "\\" else 1
            words.append(_cunescape(value[i + 1:j]))
            i = j + 1
            continue
        j = i
        while j < n and not value[j].isspace():
            j += 1
        w = value[i:j]
        words.append("<;>" if w == ";" else _cunescape(w))
        i = j
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


def env_assignments(text: str) -> list[tuple[str, str]]:
    """(key, value) as systemd's EnvironmentFile reader assigns them."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        if c in "#;":
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        eq = text.find("=", i)
        nl = text.find("\n", i)
        if eq < 0 or (0 <= nl < eq):
            i = n if nl < 0 else nl + 1  # a line without "=": ignored
            continue
        key = text[i:eq].strip()
        i = eq + 1
        val: list[str] = []
        while i < n and text[i] != "\n":
            c = text[i]
            if c == "\\" and i + 1 < n:
                if text[i + 1] != "\n":
                    val.append(text[i + 1])
                i += 2
            elif c in "\"'":
                j = i + 1
                while j < n and text[j] != c:
                    if c == '"' and text[j] == "\\" and j + 1 < n:
                        nxt = text[j + 1]
                        val.append(nxt if nxt in '"\\`$' else ("" if nxt == "\n" else "\\" + nxt))
                        j += 2
                        continue
                    val.append(text[j])
                    j += 1
                i = j + 1
            else:
                val.append(c)
                i += 1
        out.append((key, "".join(val).rstrip()))
    return out


def nccl_keys(text: str) -> list[str]:
    """The keys NCCL sets from nccl.conf: one KEY=VALUE a line, `#` lines skipped."""
    return [ln.split("=", 1)[0].strip() for ln in text.splitlines()
            if ln.strip() and not ln.lstrip().startswith("#") and "=" in ln]


def nginx_tokens(text: str) -> list[str]:
    """nginx's tokens: words and quoted strings (unescaped), `;`, `{`, `}`; comments dropped."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif c in ";{}":
            out.append(c)
            i += 1
        elif c in "\"'":
            j, buf = i + 1, []
            while j < n and text[j] != c:
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j + 1])
                    j += 2
                    continue
                buf.append(text[j])
                j += 1
            out.append("".join(buf))
            i = j + 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in ";{}\"'":
                j += 1
            out.append(text[i:j])
            i = j
    return out


def nginx_directives(text: str) -> list[str]:
    """Each directive as its block path + name (`http>upstream>server`), in order: the file's shape."""
    toks = nginx_tokens(text)
    out: list[str] = []
    stack: list[str] = []
    start = True
    cur = ""
    for t in toks:
        if t == "{":
            stack.append(cur)
            start = True
        elif t == "}":
            stack.pop()
            start = True
        elif t == ";":
            start = True
        elif start:
            cur = t
            # a map/types block holds data entries (key value;), not directives: their keys are values
            name = "<entry>" if stack and stack[-1] in ("map", "types") and t not in ("default", "hostnames") else t
            out.append(">".join([*stack, name]))
            start = False
    return out


def yaml_shape(v: Any, path: str = "") -> list[str]:
    """Every key path of a YAML document (list items by index), scalars left out: the document's shape."""
    if isinstance(v, dict):
        return [p for k, x in v.items() for p in [f"{path}/{k}", *yaml_shape(x, f"{path}/{k}")]]
    if isinstance(v, list):
        return [p for i, x in enumerate(v) for p in yaml_shape(x, f"{path}[{i}]")]
    return []
