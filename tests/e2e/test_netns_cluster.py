"""The serving cluster across hosts: network namespaces as nodes, made and
torn down by this test (tests/e2e/netns.py), so every hop crosses real
interfaces and a bridge, not loopback.

  test_netns_cluster.py BUILD_DIR MODEL

  node 0  the client (this test's sockets) and haproxy in front
  node 1  the gateways: two behind haproxy (groups A and B), one for P/D,
          and one each for group B alone and the producer alone
  node 2  group A's rank 0, node 6 its rank 1: tensor parallel across two
          hosts, its collectives over TCP (--ranks-per-node 1)
  node 3  group B: tensor parallel on one host, over shared memory
  node 4  a kv_producer     node 5  a kv_consumer (KV blocks node 4 -> 5)
  node 7  group C's pipeline stage 0, node 8 its stage 1, each stage two
          tensor-parallel ranks (--pipeline-parallel-size 2
          --tensor-parallel-size 2 --ranks-per-node 2: vLLM's shape, TP
          inside a node over shared memory, PP across nodes: the hidden rows
          and the logits cross the bridge every step)

Checks: greedy answers through haproxy equal those of group B alone (so
TP=2 over TCP between nodes gives the tokens of TP=2 over shared memory);
a long prompt's KV crosses from the producer's node to the consumer's,
answer unchanged; group C's two stages of two ranks answer as group B
(TP=2) does, token for token, and a stage (both its ranks) killed or frozen mid-stream ends
the stream (an error, no hang: --collective-timeout 5 for the frozen one)
and the group comes back; then the faults, each
on the node that serves a live stream: its interface taken down (silence,
no reset), its worker frozen (SIGSTOP), its worker killed. No stream hangs:
each resumes on the other group with its text unchanged, and the group
comes back (link up, SIGCONT, a restart). The host's own interfaces are
left as they were. Skips (77) where namespaces cannot be made (not root,
no iproute2) or haproxy is missing."""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402
from harness import Harness, sse  # noqa: E402

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
if not os.path.exists(MODEL):
    print("test_netns_cluster: model %s not found: skipped" % MODEL)
    sys.exit(77)
why = netns.available()
if why:
    print("test_netns_cluster: %s: skipped (the cluster of namespaces cannot be made here)" % why)
    sys.exit(77)
if not shutil.which("haproxy"):
    print("test_netns_cluster: haproxy not installed: skipped (apt-get install haproxy)")
    sys.exit(77)

h = Harness("llmserve-netns-")
c = netns.Cluster(9, tag="ll%x" % (os.getpid() & 0xffff))
WPORT, HPORT, LB = 7600, 7601, 8080
GW = {"g1": 8000, "g2": 8001, "gpd": 8002}
A, B, P, D, A1, C, C1 = 2, 3, 4, 5, 6, 7, 8  # nodes (A1: group A's second rank; C1: group C's stage 1)
GROUP_PORT = 7610  # group A's control channel, on node 2
ROLE = {P: '{"kv_role": "kv_producer"}', D: '{"kv_role": "kv_consumer"}'}


def waddr(node):
    return "tcp://%s:%d" % (c.addr(node), WPORT)


def worker(node, tag=""):
    args = [BUILD + "/llmserve-worker", "--model", MODEL, "--max-model-len", "1024", "--max-num-seqs", "8",
            "--threads", "1", "--log-level", "info"]
    if node in (A, A1):  # one rank a node, the group formed over node 2's address
        args += ["--tensor-parallel-size", "2", "--ranks-per-node", "1", "--node-index", str(int(node == A1)),
                 "--group-address", "tcp://%s:%d" % (c.addr(A), GROUP_PORT)]
    elif node in (C, C1):  # a stage of two ranks a node, the group formed over node 7's address
        args += ["--pipeline-parallel-size", "2", "--tensor-parallel-size", "2", "--ranks-per-node", "2",
                 "--node-index", str(int(node == C1)),
                 "--group-address", "tcp://%s:%d" % (c.addr(C), GROUP_PORT), "--collective-timeout", "5"]
    elif node == B:
        args += ["--tensor-parallel-size", "2"]
    if node not in (A1, C1):
        args += ["--listen", waddr(node), "--health-port", str(HPORT), "--health-host", c.addr(node)]
    if node in ROLE:
        args += ["--kv-transfer-config", ROLE[node]]
    p = c.start(node, args, os.path.join(h.tmp, "worker-n%d%s.log" % (node, tag)))
    if node == A:  # a group comes back whole
        worker(A1, tag)
    if node == C:
        worker(C1, tag)
    return p


def gateway(name, nodes, extra=()):
    return c.start(1, [BUILD + "/llmserve-gateway", "--host", c.addr(1), "--port", str(GW[name]), "--workers",
                       ",".join(waddr(n) for n in nodes), "--reply-address", "tcp://%s:0" % c.addr(1),
                       "--log-level", "info"] + list(extra), os.path.join(h.tmp, name + ".log"))


def request(host, port, method, path, body=None, timeout=10):
    """(status, text); (None, "") when nothing answers."""
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.request(method, path, json.dumps(body) if body is not None else None,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode()
    except OSError:
        return None, ""


def metric(host, port, name, labels=""):
    text = request(host, port, "GET", "/metrics")[1]
    m = re.search(r"^%s(?:\{[^}]*%s[^}]*\})? (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def wait(cond, t=60):
    end = time.time() + t
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.2)
    return False


def up_in(gw, node):
    return metric(c.addr(1), GW[gw], "llmserve:worker_up", waddr(node)) == 1


MODEL_ID = []


def completion(port, prompt, host=None, **kw):
    """(text, finish_reason, seconds) of a greedy completion, streamed."""
    b = {"model": MODEL_ID[0], "prompt": prompt, "max_tokens": 48, "temperature": 0, "stream": True}
    b.update(kw)
    t0, text, fin = time.time(), "", None
    conn = http.client.HTTPConnection(host or c.addr(1), port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
    for d in sse(conn.getresponse()):
        if d.get("choices"):
            text += d["choices"][0].get("text", "")
            fin = d["choices"][0].get("finish_reason") or fin
    return text, fin, time.time() - t0


def serving(gws=("g1", "g2")):
    """The node whose group has a request of gateways gws in flight."""
    for g in gws:
        for n in (A, B):
            if metric(c.addr(1), GW[g], "llmserve:gateway_inflight", waddr(n)) == 1:
                return n
    return None


def fault(name, do, undo, want=None):
    """A long stream through haproxy; once it is under way, do(node) on the node serving it (with want: only a
    stream group want serves, new prompts tried until one is): the stream must end in time with the text group
    B alone gives (resumed on the other group), and undo(node) bring the group back."""
    for attempt in range(6):
        if run_fault(name, do, undo, want, "%s %d" % (name, attempt)):
            return
    h.check(False, "%s: no stream landed on node %s" % (name, want))


def run_fault(name, do, undo, want, topic):
    prompt, kw = "Write a long story about %s, a lighthouse keeper." % topic, dict(max_tokens=300,
                                                                                   ignore_eos=True)
    # the reference gateway sees only group B: after a fault on node B it must see it back first (the
    # previous fault's undo waited for g1 and g2 alone)
    h.check(wait(lambda: up_in("gref", B), 60), "%s: group B is up in the reference gateway" % name)
    ref, ref_fin, _ = completion(GW["gref"], prompt, **kw)
    if ref_fin != "length":
        h.check(False, "%s: group B alone answered whole (%r, %d chars)" % (name, ref_fin, len(ref)))
        return True
    b = {"model": MODEL_ID[0], "prompt": prompt, "temperature": 0, "stream": True}
    b.update(kw)
    conn = http.client.HTTPConnection(c.addr(0), LB, timeout=30)  # a hang raises here
    conn.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
    r = conn.getresponse()
    text, fin, node, t_fault, err = "", None, None, None, None
    try:
        for d in sse(r):
            if "error" in d:
                err = d["error"]
            if d.get("choices"):
                text += d["choices"][0].get("text", "")
                fin = d["choices"][0].get("finish_reason") or fin
            if node is None and len(text) > 40:
                node = serving()
                if node is None or (want is not None and node != want):
                    r.read()  # another group has it: let it end, try another prompt
                    return False
                do(node)
                t_fault = time.time()
    except OSError as e:
        err = "the stream hung: %s" % e
    took = time.time() - t_fault if t_fault else -1
    h.check(node is not None, "%s: the stream ran on node %s" % (name, node))
    if text != ref:  # where the two part, for the log
        k = next((i for i, (x, y) in enumerate(zip(text, ref)) if x != y), min(len(text), len(ref)))
        print("  %s: the text parts from group B's alone at char %d of %d/%d: %r vs %r" %
              (name, k, len(text), len(ref), text[max(0, k - 20):k + 40], ref[max(0, k - 20):k + 40]))
    h.check(err is None and fin == "length" and text == ref,
            "%s: the stream ended %.1f s after the fault, resumed on the other group, text identical (%s)" %
            (name, took, err or "%d chars" % len(text)))
    if node is not None:
        undo(node)
        h.check(wait(lambda: up_in("g1", node) and up_in("g2", node), 60),
                "%s: node %d's group serves again in both gateways" % (name, node))
    return True


host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.split("\n")
host_links = sorted(re.sub(r"^\d+: ", "", l).split(":")[0] for l in host_links if l)
try:
    c.up()
    now = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.split("\n")
    h.check(sorted(re.sub(r"^\d+: ", "", l).split(":")[0] for l in now if l) == host_links,
            "nine nodes and a switch made; the host's own interfaces unchanged (%s)" % ", ".join(host_links))
    for n in (A, B, P, D, C):
        worker(n)
    gateway("g1", [A, B])
    gateway("g2", [A, B])
    gateway("gpd", [P, D], ["--max-local-prefill-length", "64"])
    GW["gref"], GW["gp"] = 8003, 8004
    gateway("gref", [B])
    gateway("gp", [P])
    GW["gc"] = 8005
    gateway("gc", [C])
    cfg = os.path.join(h.tmp, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write("""global
    maxconn 256
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    retries 2
    option redispatch
    retry-on conn-failure empty-response 503
frontend llm
    bind %s:%d
    default_backend gateways
backend gateways
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    server g1 %s:%d check inter 500 fall 2 rise 1
    server g2 %s:%d check inter 500 fall 2 rise 1
""" % (c.addr(0), LB, c.addr(1), GW["g1"], c.addr(1), GW["g2"]))
    c.start(0, ["haproxy", "-db", "-f", cfg], os.path.join(h.tmp, "haproxy.log"))
    c.enter(0)  # from here on this test's sockets are node 0's: it reaches the others over the bridge only
    ok = h.check(wait(lambda: all(up_in(g, n) for g, ns in (("g1", (A, B)), ("g2", (A, B)), ("gpd", (P, D)),
                                                                ("gref", (B,)), ("gp", (P,)), ("gc", (C,))) for n in ns), 120),
                 "the gateways on node 1 see the groups on nodes 2 to 8 over the bridge")
    h.check(any("collectives go over TCP" in l for l in open(os.path.join(h.tmp, "worker-n%d.log" % A))),
            "group A's ranks on nodes 2 and 6 meet over TCP")
    ok = ok and h.check(wait(lambda: request(c.addr(0), LB, "GET", "/health")[0] == 200, 30),
                        "haproxy on node 0 answers through them")
    h.check(request("127.0.0.1", GW["g1"], "GET", "/health")[0] is None,
            "node 0's loopback has no gateway: the traffic really crosses nodes")
    if ok:
        MODEL_ID.append(json.loads(request(c.addr(0), LB, "GET", "/v1/models")[1])["data"][0]["id"])
        prompts = ["Tell me about node %d of the cluster and its %s." % (i, w)
                   for i, w in enumerate(("river", "stone", "lantern", "orchard", "copper", "meadow"))]
        ref = [completion(GW["gref"], p)[0] for p in prompts]
        got = [completion(LB, p, host=c.addr(0))[0] for p in prompts]
        h.check(got == ref, "greedy through haproxy, two gateways and two groups on three nodes: every answer is "
                "group B's alone (TP=2 over TCP between nodes = TP=2 over shared memory)")
        served = [metric(c.addr(n), HPORT, "vllm:generation_tokens_total") or 0 for n in (A, B)]
        h.check(all(s > 0 for s in served), "both groups served (tokens generated: %s)" % served)

        # P/D: the producer's node sends the KV to the consumer's over the bridge
        long = "Summarise this report. " + " ".join("section %d covers the %s at length;" % (i, w) for i, w in
                                                    enumerate(("harbor", "glacier", "falcon", "willow") * 6))
        pd = completion(GW["gpd"], long)[0]
        h.check(pd == completion(GW["gp"], long)[0] and metric(c.addr(1), GW["gpd"],
                                                               "llmserve:disagg_handoffs_total") == 1,
                "a long prompt prefilled on node 4 and decoded on node 5: the answer is the producer's alone")
        blocks = None
        end = time.time() + 10
        while time.time() < end and not blocks:
            blocks = metric(c.addr(D), HPORT, "llmserve:kv_transfer_blocks_total", 'direction="received"')
            time.sleep(0.3)
        h.check(blocks and blocks == metric(c.addr(P), HPORT, "llmserve:kv_transfer_blocks_total",
                                            'direction="sent"'),
                "its KV blocks crossed from node 4 to node 5 (%s)" % blocks)

        # pipeline parallelism across two nodes: stage 0 on node 7, stage 1 on node 8, two ranks each
        h.check(any("pipeline stage 1 of 2" in l for l in open(os.path.join(h.tmp, "worker-n%d.log" % C1))) and
                any("2 pipeline stages of 2 ranks: each stage's collectives over shared memory, the stages' hops "
                    "over TCP" in l for l in open(os.path.join(h.tmp, "worker-n%d.log" % C))),
                "group C's stages on nodes 7 and 8 (two ranks each, over shared memory) meet over TCP")
        pref = ref  # group B alone: TP=2 (each stage sums the same two shares in the same order)
        pgot = [None] * len(prompts)

        def one(i):
            pgot[i] = completion(GW["gc"], prompts[i])[0]

        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        h.check(pgot == pref, "six greedy answers at once from PP=2 x TP=2 on two nodes: each group B's (TP=2 "
                "on one node), token for token")
        def stage_fault(what, do):
            """A long stream from group C alone; do() once it is under way: the stream must end with an error,
            not hang, and stage 0 go down with the group."""
            b = {"model": MODEL_ID[0], "prompt": "Write a long story about the %s." % what, "max_tokens": 300,
                 "ignore_eos": True, "temperature": 0, "stream": True}
            conn = http.client.HTTPConnection(c.addr(1), GW["gc"], timeout=40)  # a hang raises here
            conn.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
            text, err, t_do = "", None, None
            try:
                for d in sse(conn.getresponse()):
                    err = d.get("error") or err
                    if d.get("choices"):
                        text += d["choices"][0].get("text", "")
                    if t_do is None and len(text) > 40:
                        do([int(p) for p in subprocess.run(["ip", "netns", "pids", c.ns(C1)], capture_output=True,
                                                           text=True).stdout.split()])
                        t_do = time.time()
            except OSError as e:
                err = "the stream hung: %s" % e
            h.check(t_do is not None and err is not None and "hung" not in str(err),
                    "stage 1 on node 8 %s mid-stream: the stream ended %.1f s later with an error, no hang (%s)" %
                    (what, time.time() - (t_do or time.time()), str(err)[:80]))
            h.check(wait(lambda: not subprocess.run(["ip", "netns", "pids", c.ns(C)], capture_output=True,
                                                    text=True).stdout.split(), 30),
                    "%s: stage 0 on node 7 ended with it: the group goes down whole" % what)

        stage_fault("killed", lambda ps: [os.kill(p, signal.SIGKILL) for p in ps])
        worker(C, "-restarted")
        h.check(wait(lambda: up_in("gc", C), 60) and completion(GW["gc"], prompts[0])[0] == pref[0],
                "group C restarted on both nodes serves again, the same answer")
        stopped = []
        stage_fault("frozen", lambda ps: [os.kill(p, signal.SIGSTOP) for p in ps] and stopped.extend(ps))
        for p in stopped:  # thawed, it finds its group gone and ends
            os.kill(p, signal.SIGCONT)
        h.check(wait(lambda: not subprocess.run(["ip", "netns", "pids", c.ns(C1)], capture_output=True,
                                                text=True).stdout.split(), 30),
                "frozen: stage 1 thawed finds its group gone and ends")
        worker(C, "-restarted2")
        h.check(wait(lambda: up_in("gc", C), 60) and completion(GW["gc"], prompts[1])[0] == pref[1],
                "group C restarted again serves, the same answer")

        # the faults, each on the node serving a live stream
        fault("link down", lambda n: c.link(n, False), lambda n: c.link(n, True))
        def pids(n):
            return [int(p) for p in subprocess.run(["ip", "netns", "pids", c.ns(n)], capture_output=True,
                                                   text=True).stdout.split()]

        frozen = {}

        def freeze(n):
            frozen[n] = pids(n)
            for p in frozen[n]:
                os.kill(p, signal.SIGSTOP)

        def thaw(n):
            for p in frozen.pop(n, []):
                os.kill(p, signal.SIGCONT)

        fault("frozen", freeze, thaw)
        procs = {}

        def kill(n):
            for p in pids(n):
                os.kill(p, signal.SIGKILL)
            if n == A:  # its other rank, on node 6, sees the connection close and ends too: the group goes whole
                h.check(wait(lambda: not pids(A1), 30), "killed: group A's rank 1 on node 6 ended with its rank 0")

        fault("killed", kill, lambda n: procs.update({n: worker(n, "-restarted")}))

        # group A loses its rank on node 6 mid-stream: rank 0 notices at its next collective, the group ends
        # whole, the stream resumes on B; A restarted comes back
        def kill_rank1(n):
            for p in pids(A1):
                os.kill(p, signal.SIGKILL)
            h.check(wait(lambda: not pids(A), 30), "rank 1 killed: group A's rank 0 on node 2 ended too")

        fault("rank 1 killed", kill_rank1, lambda n: worker(A, "-restarted2"), want=A)
finally:
    c.down()
    left = [ns for ns, there in c.status().items() if there]
    h.check(not left, "every namespace removed at the end (%s left)" % left)
sys.exit(h.finish("test_netns_cluster"))
