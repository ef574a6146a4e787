#!/usr/bin/env python3
"""The layering of docs/architecture.md, checked: the floors of the core
(base < pool < bus < kit < serve) and the transports beside serve on the SDK.

  check_layering.py SRC OBJECTS    check the tree SRC and the parts' objects
  check_layering.py --self-test SRC OBJECTS
                                   plant one violation of each kind in a copy
                                   and check that each is caught

OBJECTS lists each part's object files, a line each: NAME<TAB>a.o;b.o;...
(tests/CMakeLists.txt writes it from the targets, so that objects left over
from moved sources are not read).

Checks:
  1. includes: a part includes only its own folder's headers and the one
     header (its face) of a floor below it; a transport, cli/, bench/, contract/ and
     examples/ include nothing of core/; the include graph of the parts has
     no circle.
  2. symbols (nm): the kb__ names a part's objects leave undefined are its own
     or its face floor's (a transport: its own kb__<scheme>_ prefix only); the
     graph of parts calling parts (any kb_ name one defines and another uses)
     has no circle and runs downward.
  3. greps: no KB_WITH_ in core/ or transports/; no call of rand, random,
     srand or srandom in core/ or transports/ (kb_bus_random instead); the
     lane of a hash is computed in core/pool/ only.
Exit status 1 with one line per violation."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# name: (source folder, its CMake target, floor, the floors whose face it
# may include and whose kb__ names it may call)
CORE_PARTS = {
    "base": ("core/base", "keybus_base", 0, []),
    "pool": ("core/pool", "keybus_pool", 1, []),
    "bus": ("core", "keybus_core", 2, ["pool", "base"]),
    # the consumer-group kit: on the SDK alone, under the transports that use it
    "kit": ("core/kit", "keybus_kit", 2.5, []),
    "serve": ("core/serve", "keybus_serve", 3, ["bus"]),
}
# The generated list of built-in transports (cmake/builtin_transports.c.in,
# its own part): the one seam by which the bus names what the build put in.
BUILTIN_NAMES = {"kb__builtin_transports", "kb__builtin_transports_n"}
# The one header a floor gives the floors above it.
FACE = {"base": "core/base/err.h", "pool": "core/pool/pool_calls.h", "bus": "core/bus_calls.h"}
TRANSPORT_FLOOR = 3   # beside serve: on the SDK, which the lower floors define
OUTSIDE = ["cli", "bench", "contract", "examples"]


def parts(src):
    out = dict(CORE_PARTS)
    tdir = os.path.join(src, "transports")
    for t in sorted(os.listdir(tdir)) if os.path.isdir(tdir) else []:
        if os.path.isdir(os.path.join(tdir, t)):
            out[t] = (f"transports/{t}", f"keybus_{t}", TRANSPORT_FLOOR, [])
    return out


def files_of(src, folder, exts=(".c", ".h")):
    d = os.path.join(src, folder)
    return sorted(os.path.join(folder, f) for f in os.listdir(d)
                  if f.endswith(exts) and os.path.isfile(os.path.join(d, f)))


def part_of(path, ps):
    folder = os.path.dirname(path)
    for name, (sdir, _, _, _) in ps.items():
        if folder == sdir:
            return name
    return None


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def find_cycle(edges):
    """A list of nodes in a circle of the graph {a: {b, ...}}, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if state.get(m) is None:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if state.get(n) is None:
            found = visit(n)
            if found:
                return found
    return None


def check_graph(kind, edges, ps, problems):
    cycle = find_cycle(edges)
    if cycle:
        problems.append(f"{kind}: the parts {' -> '.join(cycle)} make a circle")
    for a, bs in sorted(edges.items()):
        for b in sorted(bs):
            if ps[b][2] >= ps[a][2]:
                problems.append(f"{kind}: {a} (floor {ps[a][2]}) uses {b} (floor {ps[b][2]}), "
                                "not a floor below it")


def check_includes(src, ps, problems):
    edges = {}
    for name, (sdir, _, _, below) in ps.items():
        for f in files_of(src, sdir):
            text = open(os.path.join(src, f), encoding="utf-8").read()
            for n, line in enumerate(text.split("\n"), 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                target = os.path.normpath(os.path.join(os.path.dirname(f), m.group(1)))
                other = part_of(target, ps)
                where = f"{f}:{n}: #include \"{m.group(1)}\""
                if other == name:
                    continue
                if other is None:
                    problems.append(f"{where}: outside every part")
                    continue
                edges.setdefault(name, set()).add(other)
                if other not in below or FACE.get(other) != target:
                    problems.append(f"{where}: {name} may include only "
                                    + (", ".join(FACE[b] for b in below) or "its own headers"))
    for folder in OUTSIDE:
        for root, _, names in os.walk(os.path.join(src, folder)):
            for fn in sorted(names):
                if not fn.endswith((".c", ".h", ".cc")):
                    continue
                path = os.path.join(root, fn)
                for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                    if re.match(r'\s*#\s*include\s+"(\.\./)*core/', line):
                        problems.append(f"{os.path.relpath(path, src)}:{n}: includes core/")
    check_graph("includes", edges, ps, problems)


def nm(objs, *flags):
    if not objs:
        return set()
    out = subprocess.run(["nm", *flags, *objs], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"\b(kb_\w+)$", out, re.M))


def read_objects(path):
    """{target: [object files]} from the OBJECTS file."""
    out = {}
    for line in open(path):
        if "\t" in line:
            target, objs = line.rstrip("\n").split("\t", 1)
            out[target] = [o for o in objs.split(";") if o]
    return out


def check_symbols(objects, ps, problems):
    defined, used = {}, {}
    for name, (_, target, _, _) in ps.items():
        objs = objects.get(target, [])
        if not objs:
            if name in CORE_PARTS:
                problems.append(f"symbols: no objects of {name} ({target})")
            continue
        defined[name] = nm(objs, "--defined-only", "-g")
        used[name] = nm(objs, "-u")
    owner = {}
    for name, syms in defined.items():
        for s in syms:
            owner.setdefault(s, name)
    edges = {}
    for name, syms in used.items():
        below = ps[name][3]
        for s in sorted(syms - defined[name]):
            other = owner.get(s)
            if other is not None and other != name:
                edges.setdefault(name, set()).add(other)
            if not s.startswith("kb__"):
                continue
            if name not in CORE_PARTS and not s.startswith(f"kb__{name}_"):
                problems.append(f"symbols: {name} uses {s}, not of its kb__{name}_ prefix")
            elif name == "bus" and s in BUILTIN_NAMES:
                continue
            elif name in CORE_PARTS and other not in below:
                problems.append(f"symbols: {name} uses {s} of {other or 'no part'}; "
                                f"it may call kb__ names of {', '.join(below) or 'itself'} only")
    check_graph("calls", edges, ps, problems)


def check_greps(src, problems):
    for folder in ("core", "transports"):
        for root, _, names in os.walk(os.path.join(src, folder)):
            for fn in sorted(names):
                if not fn.endswith((".c", ".h")):
                    continue
                path = os.path.join(root, fn)
                rel = os.path.relpath(path, src)
                raw = open(path, encoding="utf-8").read()
                code = strip_comments(raw)
                for n, line in enumerate(raw.split("\n"), 1):
                    if "KB_WITH_" in line:
                        problems.append(f"{rel}:{n}: KB_WITH_ (the core and transports build "
                                        "the same whatever is compiled in)")
                for n, line in enumerate(code.split("\n"), 1):
                    if re.search(r"\b(srandom|srand|random|rand)\s*\(", line):
                        problems.append(f"{rel}:{n}: the C library's generator "
                                        "(kb_bus_random is the bus's own)")
                    if not rel.startswith("core/pool/") and re.search(r"%\s*\w+(->|\.)o\.lanes", line):
                        problems.append(f"{rel}:{n}: a lane computed outside core/pool/ "
                                        "(kb__pool_lane)")


def check(src, objects_file):
    ps = parts(src)
    problems = []
    check_includes(src, ps, problems)
    check_symbols(read_objects(objects_file), ps, problems)
    check_greps(src, problems)
    return problems


def self_test(src, objects_file):
    """Each planted violation must be reported; the copy without one must pass."""
    plants = [
        ("a transport including a core header", "src", "transports/mem/mem.c",
         '#include "../../core/bus_int.h"\n'),
        ("the pool including the bus (a circle of floors)", "src", "core/pool/pool.c",
         '#include "../bus_int.h"\n'),
        ("the bus including a pool header that is not its face", "src", "core/sink.c",
         '#include "pool/pool_int.h"\n'),
        ("the C library's generator", "src", "core/wait.c",
         "static int kb__planted(void) { return rand(); }\n"),
        ("a lane computed outside the pool", "src", "core/sink.c",
         "static unsigned kb__planted(kb_pool *p, unsigned h) { return h % p->o.lanes; }\n"),
        ("a transport calling a core internal", "obj", "keybus_mem",
         "void kb__pool_free(void *);\nvoid kb__mem_planted(void) { kb__pool_free(0); }\n"),
        ("serve calling the pool past the bus", "obj", "keybus_serve",
         "void kb__pool_free(void *);\nvoid kb__serve_planted(void) { kb__pool_free(0); }\n"),
        ("the pool calling the bus (a circle of parts)", "obj", "keybus_pool",
         "unsigned long kb_bus_random(void *);\n"
         "unsigned long kb__pool_planted(void) { return kb_bus_random(0); }\n"),
    ]
    failures = 0
    objects = read_objects(objects_file)
    with tempfile.TemporaryDirectory(prefix="kb-layering-") as tmp:
        tsrc = os.path.join(tmp, "src")
        for folder in ["core", "transports"] + OUTSIDE:
            if os.path.isdir(os.path.join(src, folder)):
                shutil.copytree(os.path.join(src, folder), os.path.join(tsrc, folder))
        planted_o = os.path.join(tmp, "planted.o")
        listing = os.path.join(tmp, "objects")

        def write_listing(extra_target=None):
            with open(listing, "w") as f:
                for target, objs in objects.items():
                    more = [planted_o] if target == extra_target else []
                    f.write(f"{target}\t{';'.join(objs + more)}\n")

        write_listing()
        clean = check(tsrc, listing)
        if clean:
            print("self-test: the unchanged copy fails:", *clean, sep="\n  ")
            failures += 1
        for what, kind, where, text in plants:
            if kind == "src":
                path = os.path.join(tsrc, where)
                before = open(path).read()
                open(path, "w").write(text + before)
            else:
                subprocess.run(["cc", "-c", "-x", "c", "-", "-o", planted_o], input=text,
                               text=True, check=True)
                write_listing(where)
            found = check(tsrc, listing)
            print(f"self-test: {what}: {'caught' if found else 'NOT CAUGHT'}")
            for p in found:
                print(f"  {p}")
            failures += not found
            if kind == "src":
                open(path, "w").write(before)
            else:
                write_listing()
    return failures


def main():
    args = sys.argv[1:]
    if args and args[0] == "--self-test":
        failures = self_test(*args[1:3])
        print(f"self-test: {failures} violation kind(s) missed")
        sys.exit(1 if failures else 0)
    if len(args) != 2:
        sys.exit(__doc__)
    problems = check(*args)
    for p in problems:
        print(p)
    print(f"layering: {len(parts(args[0]))} parts checked, {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


main()
