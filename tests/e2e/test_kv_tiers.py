"""The tiered KV cache end to end: a worker whose KV pool holds two of the
prompts, a host-memory tier under it and a disk tier under that, against a
worker that recomputes every prompt (no prefix caching), each behind its own
gateway, with the real model.

  test_kv_tiers.py BUILD_DIR MODEL

Eight prompts of ~300 tokens, twice round: the second round's prefixes come
back from the tiers (memory for the recent ones, disk for the older ones) and
every greedy answer, streamed and not, must be the recomputing worker's.
Then the worker is killed (kill -9) and restarted on the same directory: its
blocks on disk are found and served. Then every block file is corrupted:
each is refused and dropped, none served, answers unchanged. Then (as root,
where a small tmpfs can be mounted) a disk that fills up: writes fail and are
counted, answers unchanged. The gateway's router must know the blocks of
each tier from the worker's KV events."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import Harness, get, ready  # noqa: E402
from ports import free_port  # noqa: E402

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
if not os.path.exists(MODEL):
    print("test_kv_tiers: model %s not found: skipped" % MODEL)
    sys.exit(77)
h = Harness("llmserve-kvtiers-")
KV = os.path.join(h.tmp, "kv")
REF_W, REF_G, T_W, T_G, T_H = (free_port() for _ in range(5))
WORDS = ("river stone lantern orchard copper meadow violin harbor thunder saffron glacier velvet compass "
         "ember quarry falcon willow cinder marble tundra").split()


def prompt(i):
    words = [WORDS[(i * 7 + k * (i + 3)) % len(WORDS)] for k in range(220)]
    return "Document %d: %s. Summarise the document in one line." % (i, " ".join(words))


def worker(name, port, extra, health=None):
    args = [BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % port,
            "--max-model-len", "512", "--max-num-seqs", "4", "--threads", "2", "--log-level", "info"] + extra
    if health:
        args += ["--health-port", str(health), "--health-host", "127.0.0.1"]
    return h.start(args, name + ".log")


def gateway(name, port, wport):
    return h.start([BUILD + "/llmserve-gateway", "--port", str(port), "--host", "127.0.0.1", "--workers",
                    "tcp://127.0.0.1:%d" % wport, "--log-level", "warn"], name + ".log")


MODEL_ID = {}


def complete(gport, i, stream=False):
    if gport not in MODEL_ID:
        MODEL_ID[gport] = json.loads(get(gport, "/v1/models")[1])["data"][0]["id"]
    body = {"model": MODEL_ID[gport], "prompt": prompt(i), "max_tokens": 12, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % gport, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    if not stream:
        d = json.loads(raw)
        return d["choices"][0]["text"], d["usage"]
    text, usage = "", {}
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            d = json.loads(line[6:])
            if d.get("choices"):
                text += d["choices"][0].get("text", "")
            if d.get("usage"):
                usage = d["usage"]
    return text, usage


def metric(port, name, labels=""):
    st, text = get(port, "/metrics")
    m = re.search(r"^%s\{[^}]*%s[^}]*\} (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def settle(port):
    """Waits until the worker's /metrics (refreshed at most every 0.5 s, by its loop) count every request
    answered so far: two reads a second apart that agree."""
    last, end = None, time.time() + 10
    while time.time() < end:
        text = get(port, "/metrics")[1]
        now = re.findall(r"^(?:vllm:generation_tokens_total|llmserve:kv_tier_\S+)\S* \S+$", text, re.M)
        if now and now == last:
            return
        last = now
        time.sleep(1.0)


def round_of(gport, n=8, stream=False, order=None):
    """The answers in prompt order, asked in the order given (default 0..n-1)."""
    out = {i: complete(gport, i, stream) for i in (order or range(n))}
    return [out[i] for i in range(n)]


# 16 MiB of pool: 728 tokens, two prompts; 24 MiB of host memory: three more; the disk the rest
TIERS = ["--kv-cache-memory", "16MiB", "--kv-offloading-size", "24MiB", "--kv-offloading-dir", KV]
worker("ref-worker", REF_W, ["--kv-cache-memory", "64MiB", "--no-enable-prefix-caching"])
gateway("ref-gateway", REF_G, REF_W)
tw = worker("tier-worker", T_W, TIERS, T_H)
gateway("tier-gateway", T_G, T_W)
ok = h.check(ready(REF_G) and ready(T_G) and ready(T_H), "both gateways and the tiered worker are ready")
if ok:
    ref = [t for t, _ in round_of(REF_G)]
    ref_stream = [t for t, _ in round_of(REF_G, stream=True)]
    h.check(ref == ref_stream, "the recomputing worker streams what it answers")
    first = round_of(T_G)
    h.check([t for t, _ in first] == ref, "first round: the tiered worker's greedy answers are the recomputing one's")
    second = round_of(T_G, stream=True, order=list(range(7, -1, -1)))  # newest first: pool, memory, then disk
    h.check([t for t, _ in second] == ref, "second round, streamed: answers identical with prefixes from the tiers")
    cached = [((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0), u["prompt_tokens"]) for _, u in second]
    h.check(all(c >= n - 16 for c, n in cached), "second round: every prompt's full blocks came back cached (%s)" %
            cached)
    settle(T_H)
    mem = metric(T_H, "llmserve:kv_tier_hit_tokens_total", 'tier="memory"')
    disk = metric(T_H, "llmserve:kv_tier_hit_tokens_total", 'tier="disk"')
    h.check(mem and disk and mem > 0 and disk > 0, "hits from both tiers (memory %s, disk %s tokens)" % (mem, disk))
    ext = metric(T_H, "vllm:external_prefix_cache_hits_total")
    h.check(ext == mem + disk, "vllm:external_prefix_cache_hits_total counts them (%s)" % ext)
    loads = metric(T_H, "llmserve:kv_tier_load_seconds_count")
    h.check(loads and loads * 16 == mem + disk, "the load latency summary counts every block loaded (%s)" % loads)
    # the router's view, from the KV events: what each tier holds, as the worker counts it
    end, seen = time.time() + 10, None
    while time.time() < end:
        wm = metric(T_H, "llmserve:kv_tier_blocks", 'tier="memory"')
        wd = metric(T_H, "llmserve:kv_tier_blocks", 'tier="disk"')
        gm = metric(T_G, "llmserve:cached_blocks_memory_tier")
        gd = metric(T_G, "llmserve:cached_blocks_disk_tier")
        seen = (wm, gm, wd, gd)
        if wm and wd and (wm, wd) == (gm, gd):
            break
        time.sleep(0.3)
    h.check(seen[0] and seen[2] and seen[0] == seen[1] and seen[2] == seen[3],
            "the gateway knows the blocks of each tier the worker holds (worker memory %s, gateway %s; worker disk "
            "%s, gateway %s)" % seen)

    # kill -9, restart on the same directory: the disk tier's blocks are found and served
    on_disk = metric(T_H, "llmserve:kv_tier_blocks", 'tier="disk"')
    tw.send_signal(signal.SIGKILL)
    tw.wait()
    tw = worker("tier-worker-2", T_W, TIERS, T_H)
    h.check(ready(T_H) and ready(T_G), "the tiered worker restarts after kill -9")
    found = metric(T_H, "llmserve:kv_tier_blocks", 'tier="disk"')
    h.check(found == on_disk, "after the restart the disk tier holds what it held (%s of %s blocks)" % (found, on_disk))
    third = round_of(T_G)
    h.check([t for t, _ in third] == ref, "after kill -9 and restart: answers identical")
    settle(T_H)
    d2 = metric(T_H, "llmserve:kv_tier_hit_tokens_total", 'tier="disk"')
    cached = [((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0), u["prompt_tokens"]) for _, u in third]
    h.check(d2 and all(c >= n - 16 for c, n in cached),
            "after the restart every prompt's full blocks come back from disk (%s tokens; %s)" % (d2, cached))
    h.check(metric(T_H, "llmserve:kv_tier_corrupt_total") == 0, "no block file was refused")

    # every block file corrupted (one byte of its K/V): refused, dropped, never served
    tw.send_signal(signal.SIGKILL)
    tw.wait()
    sub = [os.path.join(KV, d) for d in os.listdir(KV)]
    files = [os.path.join(s, f) for s in sub for f in os.listdir(s) if f.endswith(".kvb")]
    for f in files:
        with open(f, "r+b") as fh:
            fh.seek(64 + 4 * 16 + 1000)
            b = fh.read(1)
            fh.seek(64 + 4 * 16 + 1000)
            fh.write(bytes([b[0] ^ 0x41]))
    tw = worker("tier-worker-3", T_W, TIERS, T_H)
    h.check(ready(T_H) and ready(T_G), "the tiered worker restarts on corrupt block files")
    fourth = round_of(T_G)
    h.check([t for t, _ in fourth] == ref, "with every block file corrupt: answers identical (recomputed)")
    settle(T_H)
    bad = metric(T_H, "llmserve:kv_tier_corrupt_total")
    h.check(bad and bad > 0, "the corrupt files were refused (%s)" % bad)
    left = [f for f in files if os.path.exists(f)]
    ok_left = all(open(f, "rb").read()[64 + 64 + 1000:64 + 64 + 1001] != b"" for f in left)
    h.check(metric(T_H, "llmserve:kv_tier_hit_tokens_total", 'tier="disk"') == 0 and ok_left,
            "no corrupt block was served (disk hits 0; %d of %d files left, those never asked for)" %
            (len(left), len(files)))
    tw.send_signal(signal.SIGTERM)
    tw.wait()

    # a disk that fills up: a 2 MiB tmpfs (five block files) under a 1 GiB bound
    small = os.path.join(h.tmp, "small")
    os.makedirs(small)
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", small],
                                                   capture_output=True).returncode == 0
    if not mounted:
        print("test_kv_tiers: cannot mount a small tmpfs (not root?): the full-disk part is skipped")
    else:
        try:
            tw = worker("tier-worker-4", T_W, ["--kv-cache-memory", "16MiB", "--kv-offloading-dir", small,
                                               "--kv-offloading-disk-size", "1GiB"], T_H)
            h.check(ready(T_H) and ready(T_G), "a worker whose disk tier is a 2 MiB tmpfs starts")
            full = round_of(T_G) + round_of(T_G)
            h.check([t for t, _ in full] == ref + ref, "on a full disk: answers identical")
            settle(T_H)
            werr = metric(T_H, "llmserve:kv_tier_write_errors_total")
            h.check(werr and werr > 0, "writes that failed on the full disk are counted (%s)" % werr)
            h.check(tw.poll() is None and metric(T_H, "llmserve:kv_tier_corrupt_total") == 0,
                    "the worker serves on; nothing it wrote is refused")
            tmp_left = [f for d in os.listdir(small) for f in os.listdir(os.path.join(small, d)) if f.endswith(".tmp")]
            h.check(not tmp_left, "no partial file is left behind (%s)" % tmp_left[:3])
            tw.send_signal(signal.SIGTERM)
            tw.wait()
        finally:
            subprocess.run(["umount", small], capture_output=True)

    # flags that cannot work are refused by name
    p = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--kv-offloading-size", "1GiB",
                        "--no-enable-prefix-caching"], capture_output=True, text=True, timeout=60)
    h.check(p.returncode != 0 and "prefix caching" in p.stderr, "tiers without prefix caching are refused (%s)" %
            p.stderr.strip()[-120:])
    p = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--kv-offloading-disk-size", "1GiB"],
                       capture_output=True, text=True, timeout=60)
    h.check(p.returncode == 2 and "--kv-offloading-dir" in p.stderr, "a disk bound without a directory is refused")
    p = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--kv-offloading-dir", KV, "--enable-lora"],
                       capture_output=True, text=True, timeout=60)
    h.check(p.returncode != 0 and "--enable-lora" in p.stderr, "a disk tier with LoRA adapters is refused (%s)" %
            p.stderr.strip()[-100:])
    p = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--kv-offloading-size", "lots"],
                       capture_output=True, text=True, timeout=60)
    h.check(p.returncode == 2 and "--kv-offloading-size" in p.stderr, "a size that is not one is refused")
shutil.rmtree(KV, ignore_errors=True)
sys.exit(h.finish("test_kv_tiers"))
