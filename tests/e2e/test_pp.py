"""Pipeline parallelism end to end, with real worker processes, real sockets
and the real model.

  test_pp.py BUILD_DIR MODEL

A group of two pipeline stages (--pipeline-parallel-size 2: rank 0 holds
the first half of the layers and the embeddings, rank 1 the rest and the LM
head) behind one gateway, against one rank behind another (and three stages,
with up to three steps in flight). Under continuous
batching (eight requests at once, prompts of different lengths, so prefill
chunks and decodes share steps), every answer must be the single rank's,
token for token, with the same log-probabilities: greedy and seeded,
streamed and not. Then the faults: stage 1 killed mid-stream (rank 0 sees
it at its next hop, the group ends whole, the stream resumes on the single
rank with its text unchanged), and the flags refused by name. Stages of two
ranks (PP=2 x TP=2) answer as one TP=2 group does, with n-gram speculation
on, and go down whole when a rank inside a stage dies; the same group as four
hosts on loopback (every wire over TCP) answers the same."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import Harness, get, ready, sse  # noqa: E402
from ports import free_port  # noqa: E402

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
if not os.path.exists(MODEL):
    print("test_pp: model %s not found: skipped" % MODEL)
    sys.exit(77)
h = Harness("llmserve-pp-")
ONE_W, ONE_G, PP_W, PP_G, BOTH_G, PP_H, TIGHT_W, TIGHT_G, TIGHT_H, PP3_W, PP3_G = (free_port() for _ in range(11))
TP2_W, TP2_G, PPTP_W, PPTP_G, PPTP_BOTH_G, HOSTS_W, HOSTS_G, HOSTS_J = (free_port() for _ in range(8))
NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}'
WORDS = ("river stone lantern orchard copper meadow violin harbor thunder saffron glacier velvet compass "
         "ember quarry falcon willow cinder marble tundra").split()


def prompt(i):
    w = [WORDS[(i * 7 + k * (i + 3)) % len(WORDS)] for k in range(8 + 23 * i)]
    return "Note %d: %s. Continue the note." % (i, " ".join(w))


def worker(name, port, extra):
    return h.start([BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % port,
                    "--max-model-len", "1024", "--max-num-seqs", "8", "--max-num-batched-tokens", "64",
                    "--threads", "1", "--log-level", "info"] + extra, name + ".log")


def gateway(name, port, wports):
    return h.start([BUILD + "/llmserve-gateway", "--port", str(port), "--host", "127.0.0.1", "--workers",
                    ",".join("tcp://127.0.0.1:%d" % p for p in wports), "--log-level", "info"], name + ".log")


def complete(port, body, timeout=120, each=None):
    """(text, finish_reason, token logprobs) of one completion; streamed when body says so (each(text so far)
    after every event)."""
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if not body.get("stream"):
            ch = json.loads(r.read())["choices"][0]
            return ch["text"], ch["finish_reason"], (ch.get("logprobs") or {}).get("token_logprobs")
        text, fin, lps, err = "", None, [], None
        for d in sse(r):
            if "error" in d:
                err = d["error"]
            for ch in d.get("choices", []):
                text += ch.get("text", "")
                fin = ch.get("finish_reason") or fin
                lps += (ch.get("logprobs") or {}).get("token_logprobs") or []
            if each:
                each(text)
        return text, fin if err is None else "error: %s" % err, lps or None


def at_once(port, bodies):
    out = [None] * len(bodies)

    def one(i):
        try:
            out[i] = complete(port, bodies[i])
        except Exception as e:  # noqa: BLE001 (reported as a mismatch)
            out[i] = ("failed: %s" % e, None, None)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def model_id(port):
    return json.loads(get(port, "/v1/models")[1])["data"][0]["id"]


def killed_under_stream(gport, wport, rank, ref_gport, who, other):
    """Rank `rank` of the group at wport SIGKILLed under a stream through the gateway at gport (over that
    group and another): the stream resumes on the other with its text unchanged (ref_gport's answer), and
    the group goes down whole."""
    pids = subprocess.run(["pgrep", "-f", "llmserve-worker.*--listen tcp://127.0.0.1:%d.*--rank %d " % (wport, rank)],
                          capture_output=True, text=True).stdout.split()
    h.check(len(pids) == 1, "%s is its own process (%s)" % (who, pids))
    body = {"model": mid, "prompt": prompt(3), "max_tokens": 200, "ignore_eos": True, "temperature": 0,
            "stream": True}
    want = complete(ref_gport, dict(body, stream=False))[0]
    at = {}

    def watch(text):
        if "landed" not in at and len(text) > 30:
            m = get(gport, "/metrics")[1]
            at["landed"] = re.search(r'^llmserve:gateway_inflight\{[^}]*tcp://127.0.0.1:%d[^}]*\} 1$' % wport, m,
                                     re.M) is not None
            if at["landed"] and pids:
                os.kill(int(pids[0]), signal.SIGKILL)
                at["t_kill"] = time.time()

    for attempt in range(4):  # the router picks the group: a stream that landed on the pipeline
        at.clear()
        text, fin, _ = complete(gport, body, 60, watch)
        if at.get("landed"):
            break
    t_kill = at.get("t_kill")
    h.check(t_kill is not None, "a stream landed on the stages and %s was killed under it" % who)
    h.check(fin == "length" and text == want,
            "it ended %.1f s later, resumed on %s, text identical (%s)" %
            (time.time() - (t_kill or time.time()), other, fin if fin != "length" else "%d chars" % len(text)))
    end = time.time() + 30
    grp = [p for p in h.procs if "tcp://127.0.0.1:%d" % wport in " ".join(p.args)][0]
    while time.time() < end and grp.poll() is None:
        time.sleep(0.2)
    h.check(grp.poll() is not None, "the driver ended with %s: the group goes down whole (exit %s)" %
            (who, grp.poll()))


try:
    worker("one", ONE_W, [])
    worker("pp", PP_W, ["--pipeline-parallel-size", "2", "--health-port", str(PP_H), "--health-host", "127.0.0.1"])
    gateway("gone", ONE_G, [ONE_W])
    gateway("gpp", PP_G, [PP_W])
    pp3 = worker("pp3", PP3_W, ["--pipeline-parallel-size", "3"])
    gateway("gpp3", PP3_G, [PP3_W])
    ok = h.check(ready(ONE_G) and ready(PP_G) and ready(PP3_G), "a single rank, a two-stage and a three-stage group "
                 "serve")
    log = open(os.path.join(h.tmp, "pp.log")).read()
    h.check("pipeline stage 0 of 2: layers 0..14, the embeddings" in log and
            "pipeline stage 1 of 2: layers 15..29, the LM head" in log,
            "the 30 layers split 15 + 15; the embeddings on stage 0, the LM head on stage 1")
    if ok:
        mid = model_id(ONE_G)
        bodies = []
        for i in range(8):
            b = {"model": mid, "prompt": prompt(i), "max_tokens": 24 + 3 * i, "logprobs": 2, "stream": i % 2 == 1}
            if i == 5:  # two choices: the second forks from the first's prompt, in the same virtual engine
                b.update(temperature=0.8, seed=100 + i, n=2, stream=False)
            elif i % 3 == 2:
                b.update(temperature=0.8, seed=100 + i)
            else:
                b.update(temperature=0)
            bodies.append(b)
        ref = at_once(ONE_G, bodies)
        got = at_once(PP_G, bodies)
        same = sum(1 for a, b in zip(ref, got) if a == b and a[1] in ("length", "stop"))
        h.check(same == len(bodies), "eight requests at once (greedy and seeded, streamed and not): %d/%d answers "
                "and their log-probabilities equal to one rank's" % (same, len(bodies)))
        if same != len(bodies):
            for a, b in zip(ref, got):
                if a != b:
                    print("  one rank: %r\n  2 stages: %r" % (a[:2], b[:2]))
                    break
        got3 = at_once(PP3_G, bodies)
        h.check(got3 == ref, "three stages (10 layers each, steps overlapped): the same %d answers" % len(ref))
        pp3.terminate()
        pp3.wait(30)
        peak = re.search(r"pipeline of 3 stages: (\d+) steps launched, up to (\d+) in flight at once",
                         open(os.path.join(h.tmp, "pp3.log")).read())
        h.check(peak and int(peak.group(2)) == 3, "three stages: three steps in flight at once (%s)" %
                (peak.group(0) if peak else "no summary in the log"))
        steps = [l for l in open(os.path.join(h.tmp, "pp.log")) if "rank 1" in l and "failed" in l]
        h.check(not steps, "stage 1 ran every step")

        # stages of two ranks (PP=2 x TP=2: four processes, each stage its own TP comm) against one TP=2
        # group: each stage sums the same two shares in the same order, so the answers are the TP group's;
        # with n-gram speculation on the stages (its verify step is a step of more rows: the same answers)
        tp2 = worker("tp2", TP2_W, ["--tensor-parallel-size", "2"])
        gateway("gtp2", TP2_G, [TP2_W])
        worker("pptp", PPTP_W, ["--pipeline-parallel-size", "2", "--tensor-parallel-size", "2",
                                "--speculative-config", NGRAM])
        gateway("gpptp", PPTP_G, [PPTP_W])
        if h.check(ready(TP2_G) and ready(PPTP_G), "a TP=2 group and a PP=2 x TP=2 group serve"):
            log = open(os.path.join(h.tmp, "pptp.log")).read()
            h.check("2 pipeline stages of 2 ranks" in log and "rank 3 of 4" in log and
                    "pipeline stage 1 of 2: layers 15..29, the LM head" in log,
                    "four ranks in two stages of two, each stage its own comm")
            echo = [{"model": mid, "prompt": "Say it again: %s. %s. %s." % ((" ".join(WORDS[i:i + 4]),) * 3),
                     "max_tokens": 40, "logprobs": 1, "temperature": 0, "stream": i % 2 == 0} for i in range(3)]
            ref2 = at_once(TP2_G, bodies + echo)
            got = at_once(PPTP_G, bodies + echo)
            same = sum(1 for a, b in zip(ref2, got) if a == b and a[1] in ("length", "stop"))
            drafts = re.search(r"^vllm:spec_decode_num_draft_tokens_total\S* (\S+)$", get(PPTP_G, "/metrics")[1], re.M)
            h.check(same == len(ref2) and drafts and float(drafts.group(1)) > 0,
                    "PP=2 x TP=2 with n-gram speculation (%s tokens drafted): %d/%d answers and log-probabilities "
                    "equal to TP=2's, under continuous batching with the stages overlapped" %
                    (drafts.group(1) if drafts else "?", same, len(ref2)))
            for i, (a, b) in enumerate(zip(ref2, got)):
                if a != b:
                    print("  request %d\n  TP=2:        %r\n  PP=2 x TP=2: %r" % (i, a, b))
                    break
            # a rank that is neither the driver nor a stage's first one (stage 1's second) killed mid-stream:
            # its stage's first rank sees it at the next collective, the pipe ends, the group goes down whole
            gateway("gpptpboth", PPTP_BOTH_G, [PPTP_W, TP2_W])
            if h.check(ready(PPTP_BOTH_G), "a gateway over the PP x TP group and the TP group"):
                killed_under_stream(PPTP_BOTH_G, PPTP_W, 3, TP2_G, "stage 1's second rank", "the TP=2 group")
            # the same group as four hosts (--ranks-per-node 1, each rank started on its own with --node-index,
            # joining over TCP): each stage's TP comm is TCP too, around a first rank that is not rank 0 for
            # stage 1 (its address is its own end of its connection to rank 0)
            for i in range(4):
                h.start([BUILD + "/llmserve-worker", "--model", MODEL, "--max-model-len", "1024", "--max-num-seqs", "8",
                         "--threads", "1", "--log-level", "info", "--pipeline-parallel-size", "2",
                         "--tensor-parallel-size", "2", "--ranks-per-node", "1", "--node-index", str(i),
                         "--group-address", "tcp://127.0.0.1:%d" % HOSTS_J] +
                        (["--listen", "tcp://127.0.0.1:%d" % HOSTS_W] if i == 0 else []), "hosts%d.log" % i)
            gateway("ghosts", HOSTS_G, [HOSTS_W])
            if h.check(ready(HOSTS_G), "PP=2 x TP=2 as four hosts on loopback serves"):
                log = open(os.path.join(h.tmp, "hosts0.log")).read()
                got = at_once(HOSTS_G, bodies)
                h.check("2 pipeline stages of 2 ranks: each stage's collectives over TCP, the stages' hops over TCP"
                        in log and got == ref2[:len(bodies)],
                        "every wire over TCP (the stages' TP comms and the hops): %d/%d answers equal to TP=2's" %
                        (sum(1 for a, b in zip(ref2, got) if a == b), len(bodies)))
        tp2.terminate()

        # clients gone mid-stream while their steps are in flight: the rows come back to no one, the rest go on
        def drop(i):
            b = {"model": mid, "prompt": prompt(i), "max_tokens": 200, "ignore_eos": True, "temperature": 0,
                 "stream": True}
            req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % PP_G, json.dumps(b).encode(),
                                         {"Content-Type": "application/json"})
            r = urllib.request.urlopen(req, timeout=60)
            for _ in range(6):
                r.readline()
            r.close()

        for rnd in range(3):
            ts = [threading.Thread(target=drop, args=(i,)) for i in range(4)]
            for t in ts:
                t.start()
            again = at_once(PP_G, bodies[:4])
            for t in ts:
                t.join()
        time.sleep(1)
        m = get(PP_H, "/metrics")[1]
        aborted = re.search(r"^llmserve:worker_requests_aborted_total\S* (\S+)$", m, re.M)
        h.check(again == ref[:4] and aborted and float(aborted.group(1)) >= 12,
                "twelve streams dropped by their clients while others ran (%s aborted): the others' answers "
                "unchanged" % (aborted.group(1) if aborted else "?"))

        # too little KV cache for the load: preemption works per virtual engine
        tight = worker("tight", TIGHT_W, ["--pipeline-parallel-size", "2", "--kv-cache-memory", "5MiB", "--max-model-len", "400",
                                          "--health-port", str(TIGHT_H), "--health-host", "127.0.0.1"])
        gateway("gtight", TIGHT_G, [TIGHT_W])
        if h.check(ready(TIGHT_G), "a two-stage group with 5 MiB of KV cache a stage (455 tokens) serves"):
            long_bodies = [dict(b, max_tokens=120, ignore_eos=True, n=1) for b in bodies]
            got = at_once(TIGHT_G, long_bodies)
            pre = re.search(r"^vllm:num_preemptions_total\S* (\S+)$", get(TIGHT_H, "/metrics")[1], re.M)
            h.check(all(g[1] == "length" for g in got) and pre and float(pre.group(1)) > 0,
                    "eight long answers at once all complete (%s preemptions)" % (pre.group(1) if pre else "?"))

        # stage 1 killed mid-stream: the group ends whole, the stream resumes on the single rank
        gateway("gboth", BOTH_G, [PP_W, ONE_W])
        h.check(ready(BOTH_G), "a gateway over both")
        killed_under_stream(BOTH_G, PP_W, 1, ONE_G, "stage 1", "the single rank")

    def refused(extra, words):
        p = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--pipeline-parallel-size", "2"] + extra,
                           capture_output=True, text=True, timeout=60)
        return p.returncode == 2 and words in p.stderr, p.stderr.strip()[-200:]

    for extra, words, what in (
            (["--speculative-config", '{"method": "draft_model", "model": "%s", "num_speculative_tokens": 3}' % MODEL],
             "a draft model", "with a draft model"),
            (["--kv-transfer-config", '{"kv_role": "kv_producer"}'], "--kv-transfer-config",
             "as a kv_producer")):
        r, err = refused(extra, words)
        h.check(r, "--pipeline-parallel-size 2 %s is refused by name (%s)" % (what, err.split("\n")[-1]))
    r, err = refused(["--pipeline-parallel-size", "31"], "more stages than the model's 30 layers")
    h.check(r, "31 stages of a 30-layer model are refused (%s)" % err.split("\n")[-1])
finally:
    sys.exit(h.finish("test_pp"))
