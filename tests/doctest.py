#!/usr/bin/env python3
"""Run the examples of README.md and docs/*.md marked runnable and compare
their output with the output shown beside them (docs/testing.md, "Examples
that run").

A runnable example is a ```c or ```sh fenced block right under the line
    <!-- doctest transports=mem,redis,nats -->
(the transports it runs on; KEYBUS_TRANSPORT holds the URL). Its output is the
next fenced block, fenced as ```text, before any other code block. A C example
is a whole program, built against the library; a shell example runs in bash
-e with the build's `keybus` first on PATH, in a fresh temporary directory.
Both must exit 0 and print exactly the output shown.

Usage: doctest.py SOURCE_DIR LIB_DIR BIN_DIR TRANSPORT URL
(LIB_DIR holds libkeybus.so, BIN_DIR the keybus command)
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

MARK = re.compile(r"^<!-- doctest transports=([a-z,]+) -->$")
FENCE = re.compile(r"^```(\w*)\s*$")


def examples(path):
    """(line, language, code, transports, expected output) per marked block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = MARK.match(lines[i])
        i += 1
        if not m:
            continue
        where = f"{path}:{i}"
        fence = FENCE.match(lines[i]) if i < len(lines) else None
        if not fence or fence.group(1) not in ("c", "sh"):
            sys.exit(f"{where}: a doctest mark must be followed by a ```c or ```sh block")
        lang, body, i = fence.group(1), [], i + 1
        while not FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        i += 1
        while i < len(lines) and not FENCE.match(lines[i]):
            i += 1
        if i == len(lines) or FENCE.match(lines[i]).group(1) != "text":
            sys.exit(f"{where}: no ```text block with the output after the example")
        out, i = [], i + 1
        while not FENCE.match(lines[i]):
            out.append(lines[i])
            i += 1
        i += 1
        found.append((where, lang, "\n".join(body) + "\n", m.group(1).split(","),
                      "\n".join(out) + "\n"))
    return found


def ini_blocks(path):
    """(line, text) of every ```ini block: each must load as it is shown."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        i += 1
        if not fence:
            continue
        start, body = i, []
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        i += 1
        if fence.group(1) == "ini":
            found.append((f"{path}:{start}", "\n".join(body) + "\n"))
    return found


def load_ini(text, env, tmp):
    """`keybus -c FILE conf` on the block: it loads when the exit is 0."""
    path = os.path.join(tmp, "example.ini")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return subprocess.run(["keybus", "-c", path, "conf"], cwd=tmp, env=env, text=True,
                          capture_output=True, timeout=60)


def run(src, lib, lang, code, env, tmp):
    if lang == "sh":
        return subprocess.run(["bash", "-e", "-c", code], cwd=tmp, env=env, text=True,
                              capture_output=True, timeout=120)
    with open(os.path.join(tmp, "example.c"), "w", encoding="utf-8") as f:
        f.write(code)
    exe = os.path.join(tmp, "example")
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I", os.path.join(src, "include"),
                         "example.c", "-o", exe, "-L", lib, "-lkeybus",
                         "-Wl,-rpath," + lib], cwd=tmp, text=True, capture_output=True)
    if cc.returncode != 0:
        return cc
    return subprocess.run([exe], cwd=tmp, env=env, text=True, capture_output=True, timeout=120)


def main():
    src, lib, bindir, transport, url = sys.argv[1:6]
    pages = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))
    env = dict(os.environ, KEYBUS_TRANSPORT=url,
               PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    ran = failed = 0
    for page in pages:
        for where, lang, code, transports, want in examples(page):
            if transport not in transports:
                continue
            ran += 1
            with tempfile.TemporaryDirectory(prefix="keybus-doctest-") as tmp:
                got = run(src, lib, lang, code, env, tmp)
            if got.returncode != 0 or got.stdout != want:
                failed += 1
                print(f"{where} ({lang}, {transport}): exit {got.returncode}\n"
                      f"--- shown\n{want}--- printed\n{got.stdout}--- stderr\n{got.stderr}")
        if transport != "mem":
            continue
        for where, text in ini_blocks(page):
            ran += 1
            with tempfile.TemporaryDirectory(prefix="keybus-doctest-") as tmp:
                got = load_ini(text, env, tmp)
            if got.returncode != 0:
                failed += 1
                print(f"{where} (ini): keybus -c FILE conf exit {got.returncode}\n{got.stderr}")
    print(f"{ran} example(s) on {transport}, {failed} failed")
    if ran == 0:
        sys.exit(f"no example marked for {transport}")
    sys.exit(1 if failed else 0)


main()
