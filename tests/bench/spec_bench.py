#!/usr/bin/env python3
"""Speculative decoding's speed-up against concurrency, side by side.

Two `llmserve serve` processes on the same model, one plain and one with
prompt-lookup (n-gram) drafts, take turns under `llmserve bench serve` (greedy,
so both produce the same tokens) on two workloads:
  copy  completions whose output repeats the prompt: a generated Python module,
        then "the same module again" (code editing and quoting, where n-gram
        drafts pay);
  chat  free questions on /v1/chat/completions (where drafts rarely match, and
        speculation must not cost).
For each concurrency and workload: output tok/s of each (median of --reps runs,
interleaved), the ratio, and the server's acceptance. A benchmark, not a test.

  tests/bench/spec_bench.py [--model GGUF] [--concurrency 1,4,16,32] [--reps 2]
                            [--spec "--num-speculative-tokens 4"] [--threads 2]
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORDS = ("total count price item order user name value index result record table row key cache "
         "buffer limit offset weight score node edge path queue batch token block").split()


def module(rng):
    """A small Python module with generated names: a few functions of loops and sums."""
    out = []
    for _ in range(rng.randint(2, 3)):
        f = "_".join(rng.sample(WORDS, 2))
        a, b, c = rng.sample(WORDS, 3)
        out.append(f"def {f}({a}s, {b}):\n"
                   f"    {c} = 0\n"
                   f"    for {a} in {a}s:\n"
                   f"        if {a}.{b} > {b}:\n"
                   f"            {c} += {a}.{b} * 2\n"
                   f"        else:\n"
                   f"            {c} -= 1\n"
                   f"    return {c}\n")
    return "\n\n".join(out)


QUESTIONS = ["Why is the sky blue?", "What makes a good cup of tea?", "How do birds find their way south?",
             "Describe a walk through a forest in autumn.", "What is the best way to learn a new language?",
             "Why do cats purr?", "How does a bicycle stay upright?", "What should I pack for a weekend hike?",
             "Tell me about the history of bread.", "How do volcanoes form?", "What is a good morning routine?",
             "Why do we dream?", "How are rainbows made?", "What do bees do in winter?",
             "How can I keep houseplants alive?", "What is the tallest tree in the world?"]


def datasets(n, seed=1):
    rng = random.Random(seed)
    copy, chat = [], []
    for i in range(n):
        code = module(rng)
        first = code.split("\n")[0]
        prompt = f"Here is a Python module:\n\n{code}\n\nHere is the same module again, unchanged:\n\n{first}\n"
        copy.append({"conversations": [{"from": "human", "value": prompt},
                                       {"from": "gpt", "value": code[len(first) + 1:]}]})
        q = QUESTIONS[i % len(QUESTIONS)]
        chat.append({"conversations": [{"from": "human", "value": q},
                                       {"from": "gpt", "value": "x" * 480}]})
    return copy, chat


def wait_health(port, proc, secs=90):
    for _ in range(secs * 4):
        if proc.poll() is not None:
            sys.exit(f"spec_bench: the server on {port} exited ({proc.returncode})")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except Exception:
            time.sleep(0.25)
    sys.exit(f"spec_bench: the server on {port} did not become ready")


def bench(binary, model, port, path, n, conc, endpoint):
    out = subprocess.run([binary, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--tokenizer", model,
                          "--endpoint", endpoint, "--dataset-name", "sharegpt", "--dataset-path", path,
                          "--num-prompts", str(n), "--max-concurrency", str(conc)], capture_output=True, text=True).stdout
    m = re.search(r"output: ([0-9.]+) tok/s", out)
    a = re.search(r"\(([0-9.]+)%\), mean acceptance length ([0-9.]+)", out)
    f = re.search(r"Successful requests: (\d+)\s+failed: (\d+)", out)
    if not m or not f or f.group(2) != "0":
        sys.exit(f"spec_bench: bench serve failed on port {port}:\n{out[-2000:]}")
    return float(m.group(1)), (float(a.group(1)), float(a.group(2))) if a else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--concurrency", default="1,4,16,32")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spec", default="--num-speculative-tokens 4")
    ap.add_argument("--workloads", default="copy,chat")
    a = ap.parse_args()
    binary = os.path.join(a.build, "llmserve")
    if not os.path.exists(a.model):
        sys.exit(f"spec_bench: no model at {a.model} (tools/setup.sh fetches the default)")
    concs = [int(c) for c in a.concurrency.split(",")]
    tmp = tempfile.mkdtemp(prefix="spec_bench.")
    copy, chat = datasets(max(64, 2 * max(concs)))
    paths = {}
    for name, d in (("copy", copy), ("chat", chat)):
        paths[name] = os.path.join(tmp, name + ".json")
        with open(paths[name], "w") as f:
            json.dump(d, f)
    base = 18600 + os.getpid() % 500
    procs = {}
    for mode, extra in (("plain", []), ("spec", a.spec.split())):
        port = base + (mode == "spec")
        procs[mode] = (port, subprocess.Popen([binary, "serve", a.model, "--threads", str(a.threads), "--port",
                                               str(port)] + extra, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
    try:
        for mode in procs:
            wait_health(*procs[mode])
        print(f"model {os.path.basename(a.model)}, {a.threads} thread(s); spec server: {a.spec}; "
              f"greedy; medians of {a.reps}")
        print(f"{'workload':8} {'conc':>5} {'plain tok/s':>12} {'spec tok/s':>11} {'speed-up':>9} "
              f"{'accepted':>9} {'mean len':>9}")
        for c in concs:
            n = max(6, 2 * c)
            for w in a.workloads.split(","):
                res = {"plain": [], "spec": []}
                acc = []
                for _ in range(a.reps):
                    for mode in ("plain", "spec"):
                        tps, sp = bench(binary, a.model, procs[mode][0], paths[w], n, c,
                                        "/v1/completions" if w == "copy" else "/v1/chat/completions")
                        res[mode].append(tps)
                        if sp:
                            acc.append(sp)
                p, s = statistics.median(res["plain"]), statistics.median(res["spec"])
                ar = f"{statistics.median(x[0] for x in acc):8.1f}%" if acc else f"{'-':>9}"
                ml = f"{statistics.median(x[1] for x in acc):9.2f}" if acc else f"{'-':>9}"
                print(f"{w:8} {c:5d} {p:12.1f} {s:11.1f} {s / p:8.2f}x {ar} {ml}", flush=True)
    finally:
        for port, proc in procs.values():
            proc.send_signal(signal.SIGINT)
        for port, proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
