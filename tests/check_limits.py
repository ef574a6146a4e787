#!/usr/bin/env python3
"""docs/limits.md, "Every limit in the code": each row's code line is in its
file and sets the row's value, and every #define with MAX in its name under
core/, transports/, include/ and cli/ has a row.  Usage: check_limits.py SRC"""
import glob
import os
import re
import sys

SRC = sys.argv[1]
PAGE = os.path.join(SRC, "docs", "limits.md")


def squash(text):
    return re.sub(r"\s+", " ", text).strip()


def rows():
    text = open(PAGE, encoding="utf-8").read()
    section = text.split("## Every limit in the code", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 4 or cells[1] in ("value", "---"):
            continue
        yield cells[0], cells[1], cells[2].strip("`"), cells[3].strip("`").replace("\\|", "|")


def value_of(code, defines):
    """The number the code line sets: a #define's expression, else [N] or > N."""
    m = re.match(r"#define \w+ (.+)", code)
    if m:
        expr = re.sub(r"/\*.*", "", m.group(1))
        expr = re.sub(r"(\d+)[uUlL]+\b", r"\1", expr).replace("/", "//")  # C integer arithmetic
        for name, v in defines.items():
            expr = re.sub(rf"\b{name}\b", str(v), expr)
        if not re.fullmatch(r"[0-9 ()+*<\-/]+", expr):
            sys.exit(f"{PAGE}: cannot evaluate {code!r}")
        return eval(expr)
    numbers = re.findall(r"\d+", code)
    return int(numbers[-1])


def main():
    failures, defines, listed = [], {}, set()
    for what, value, where, code in rows():
        path = os.path.join(SRC, where)
        if not os.path.isfile(path) or squash(code) not in squash(open(path).read()):
            failures.append(f"{where}: no line {code!r} ({what})")
            continue
        got = value_of(code, defines)
        want = int(re.search(r"[\d,]+", value).group(0).replace(",", ""))
        if got != want:
            failures.append(f"{where}: {code!r} sets {got}, the table says {want} ({what})")
        m = re.match(r"#define (\w+)", code)
        if m:
            defines[m.group(1)] = got
            listed.add(m.group(1))
    for d in ("core", "transports", "include", "cli"):
        for path in glob.glob(os.path.join(SRC, d, "**", "*.[ch]"), recursive=True):
            for name in re.findall(r"^#define (\w*MAX\w*)", open(path).read(), re.M):
                if name not in listed:
                    failures.append(f"{os.path.relpath(path, SRC)}: {name} has no row in {PAGE}")
    if not defines:
        failures.append(f"{PAGE}: no table rows found")
    for f in failures:
        print(f)
    print(f"{len(listed)} defines and the other rows checked, {len(failures)} problem(s)")
    sys.exit(1 if failures else 0)


main()
