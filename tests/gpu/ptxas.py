"""Registers, spills, stack and shared memory of every CUDA kernel as ptxas reports them (nvcc -Xptxas -v),
one line a kernel: no GPU needed. docs/tuning.md keeps its table.
  ptxas.py [ARCH]      (default sm_90)"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
arch = sys.argv[1] if len(sys.argv) > 1 else "sm_90"
inc = [f"-I{os.path.join(ROOT, d)}" for d in ("kernels/cuda", "kernels", "common/base", "common/model")]
rows = []
for cu in sorted(glob.glob(os.path.join(ROOT, "kernels/cuda/*.cu"))):
    p = subprocess.run(["nvcc", f"-arch={arch}", "-O3", "-std=c++17", "-Xptxas", "-v", *inc, "-c", cu,
                        "-o", os.devnull], capture_output=True, text=True)
    if p.returncode:
        sys.exit(p.stderr)
    cur = None
    for line in p.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for", line)
        if m:
            cur = {"file": os.path.basename(cu), "name": m.group(1)}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = (int(x) for x in m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
names = subprocess.run(["c++filt"], input="\n".join(r["name"] for r in rows), capture_output=True,
                       text=True).stdout.splitlines()
print(f"| kernel ({arch}) | file | registers | spill stores/loads (B) | stack (B) | static smem (B) |")
print("|---|---|---|---|---|---|")
for r, n in zip(rows, names):
    n = re.sub(r"\(.*", "", n).replace("void ", "")
    print(f"| `{n}` | {r['file']} | {r.get('regs', '?')} | {r.get('spill_st', '?')}/{r.get('spill_ld', '?')} | "
          f"{r.get('stack', '?')} | {r.get('smem', '?')} |")
spills = [r for r in rows if r.get("spill_st") or r.get("spill_ld")]
print(f"\n{len(rows)} kernels, {len(spills)} with spills")
