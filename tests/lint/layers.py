#!/usr/bin/env python3
"""layers: the tree's shape, checked from the build.

1. No two source files call each other, and no longer circle of calls:
   every object file's defined and undefined symbols (nm) make a graph of
   files; any strongly connected part of more than one file fails, named
   with the symbols that close it.
2. Headers are included down the floors only: common/base < model < text
   < grammar < oai, then kernels, proto, worker, gateway, tools; a file
   includes its own folder's headers and lower ones (the worker never the
   gateway's or the OpenAI shapes').
3. No source file over 900 lines, generated tables aside.

usage: layers.py SOURCE_DIR BUILD_DIR"""
import collections, os, re, subprocess, sys

src, build = sys.argv[1], sys.argv[2]
bad = []

# ---- 1. calls --------------------------------------------------------------
objs = []
for root, _, files in os.walk(os.path.join(build, "CMakeFiles")):
    if ".dir" not in root or "/tests/" in root.replace(build, "") or "CompilerId" in root:
        continue
    objs += [os.path.join(root, f) for f in files if f.endswith(".o")]
defs, uses = {}, collections.defaultdict(set)
for o in objs:
    name = o.split(".dir/", 1)[1][:-2]
    if name.startswith(("tests/", "fuzz/")):
        continue
    out = subprocess.run(["nm", o], capture_output=True, text=True).stdout
    for line in out.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in "TDBR":
            defs.setdefault(p[2], name)
        elif len(p) == 2 and p[0] == "U":
            uses[name].add(p[1])
if len(defs) < 100:
    print("layers: only %d symbols in %s: build it first" % (len(defs), build))
    sys.exit(1)
edges = collections.defaultdict(lambda: collections.defaultdict(set))
for f, us in uses.items():
    for s in us:
        t = defs.get(s)
        if t and t != f:
            edges[f][t].add(s)
index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(100000)


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges.get(v, {}):
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            comps.append(sorted(comp))


for v in list(edges):
    if v not in index:
        visit(v)
for comp in comps:
    bad.append("files that call each other: " + ", ".join(comp))
    for a in comp:
        for b in comp:
            if b in edges[a]:
                bad.append("    %s -> %s: %s" % (a, b, ", ".join(sorted(edges[a][b])[:5])))
print("layers: %d files, %d calls across files, %d circles" % (len(uses), sum(len(e) for e in edges.values()), len(comps)))

# ---- 2. includes -------------------------------------------------------------
FLOORS = ["common/base", "common/model", "common/text", "common/grammar", "common/oai", "kernels", "proto", "worker",
          "gateway", "tools"]
ALLOWED = {  # which floors each may include, beyond its own
    "common/base": [], "common/model": ["common/base"], "common/text": ["common/base", "common/model"],
    "common/grammar": ["common/base", "common/model", "common/text"],
    "common/oai": ["common/base", "common/model", "common/text", "common/grammar"],
    "kernels": ["common/base", "common/model"],
    "proto": ["common/base", "common/model"],
    "worker": ["common/base", "common/model", "common/text", "common/grammar", "kernels", "proto"],
    "gateway": ["common/base", "common/model", "common/text", "common/grammar", "common/oai", "proto"],
    "tools": FLOORS[:-1],
}


def floor_of(path):
    for f in sorted(FLOORS, key=len, reverse=True):
        if path.startswith(f + "/"):
            return f
    return None


home, sources = {}, []
for f in FLOORS:
    for root, _, files in os.walk(os.path.join(src, f)):
        for n in files:
            rel = os.path.relpath(os.path.join(root, n), src)
            if n.endswith((".c", ".h", ".cu", ".cuh")):
                home.setdefault(n, floor_of(rel))
                sources.append(rel)
n_inc = 0
for rel in sources:
    fl = floor_of(rel)
    for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', open(os.path.join(src, rel), errors="replace").read(), re.M):
        to = home.get(os.path.basename(inc))
        n_inc += 1
        if to and to != fl and to not in ALLOWED[fl]:
            bad.append("%s (%s) includes %s (%s): upward or sideways" % (rel, fl, inc, to))
print("layers: %d includes checked across %d floors" % (n_inc, len(FLOORS)))

# ---- 3. sizes ----------------------------------------------------------------
n_files = 0
for top in FLOORS + ["tests"]:
    for root, _, files in os.walk(os.path.join(src, top)):
        for n in files:
            if not n.endswith((".c", ".h", ".cu", ".cuh", ".py", ".sh")):
                continue
            p = os.path.join(root, n)
            text = open(p, errors="replace").read()
            if "generated" in text[:300].lower():
                continue
            n_files += 1
            lines = text.count("\n")
            if lines > 900:
                bad.append("%s: %d lines (at most 900)" % (os.path.relpath(p, src), lines))
print("layers: %d files measured" % n_files)

for b in bad:
    print("layers: FAIL " + b)
sys.exit(1 if bad else 0)
