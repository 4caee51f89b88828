"""Pipeline stages on the GPU: two stages of one GPU each (host-staged hops: a stage's rows go down to the
host, over the stages' pair, and up again), here two processes sharing the one GPU, against one rank on
it, on dummy weights of a head_dim-128 llama shape.

  pp_gpu.py BUILD_DIR [--device cuda|cpu]

One request at a time, every step is the same step on both (the same rows, the same kernels, the same
GEMM shapes), so the greedy tokens and their log-probabilities must be equal; then eight at once through
the stages (continuous batching over two virtual engines, both stages busy) must all complete. --device
cpu runs the same check on the CPU backend (how the script itself is tested where no GPU is). With four
GPUs, stages of two GPUs each (an NCCL communicator a stage) against one TP=2 group too. Exit 0 when every
check holds."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import Harness, ready  # noqa: E402
from ports import free_port  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
DEVICE = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
h = Harness("llmserve-ppgpu-")
cfg = os.path.join(h.tmp, "config.json")
GPU = DEVICE == "cuda"  # the CPU run (a check of the script, under sanitizers too) takes a smaller shape
LAYERS = 8 if GPU else 4
with open(cfg, "w") as f:  # head_dim 128, GQA 4, the layers split in two, a vocabulary the stand-in tokenizer covers
    json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": 1024 if GPU else 512,
               "intermediate_size": 2816 if GPU else 1024, "num_attention_heads": 8 if GPU else 4,
               "num_key_value_heads": 2 if GPU else 1, "num_hidden_layers": LAYERS, "vocab_size": 32000,
               "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}, f)
ONE_W, ONE_G, PP_W, PP_G, TP_W, TP_G, PPTP_W, PPTP_G = (free_port() for _ in range(8))
N_GPU = len(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.split("\n")) - 1 if GPU else 0


def worker(name, port, extra):
    return h.start([BUILD + "/llmserve-worker", "--load-format", "dummy", "--model-config", cfg, "--device", DEVICE,
                    "--listen", "tcp://127.0.0.1:%d" % port, "--max-model-len", "1024", "--max-num-seqs", "8",
                    "--max-num-batched-tokens", "256", "--log-level", "info"] +
                   (["--threads", "1"] if DEVICE == "cpu" else []) + extra, name + ".log")


def same_answers(a_port, b_port, what):
    prompts = ["word %d " % i * (3 + 7 * i) for i in range(4)]
    same = 0
    for p in prompts:
        a, b = complete(a_port, p, 16), complete(b_port, p, 16)
        same += a == b
        if a != b:
            print("  %r\n  %r" % (a[2][:4], b[2][:4]))
    h.check(same == len(prompts), "%s, one request at a time: %d/%d answers and log-probabilities equal" %
            (what, same, len(prompts)))


def gateway(name, port, wport):
    return h.start([BUILD + "/llmserve-gateway", "--port", str(port), "--host", "127.0.0.1", "--workers",
                    "tcp://127.0.0.1:%d" % wport, "--load-format", "dummy", "--model-config", cfg,
                    "--log-level", "info"], name + ".log")


def complete(port, prompt, n):
    body = {"model": "dummy-config.json", "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 1, "ignore_eos": True}
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        ch = json.loads(r.read())["choices"][0]
        return ch["text"], ch["finish_reason"], ch["logprobs"]["token_logprobs"]


try:
    worker("one", ONE_W, [])
    worker("pp", PP_W, ["--pipeline-parallel-size", "2"])
    gateway("gone", ONE_G, ONE_W)
    gateway("gpp", PP_G, PP_W)
    t0 = time.time()
    ok = h.check(ready(ONE_G, 300) and ready(PP_G, 300), "one rank and two stages on %s serve (%.0f s)" %
                 (DEVICE, time.time() - t0))
    log = open(os.path.join(h.tmp, "pp.log")).read()
    h.check("pipeline stage 1 of 2: layers %d..%d, the LM head" % (LAYERS // 2, LAYERS - 1) in log,
            "stage 1 holds layers %d..%d and the LM head" % (LAYERS // 2, LAYERS - 1))
    if ok:
        same_answers(ONE_G, PP_G, "two stages against one rank")
        out = [None] * 8

        def one(i):
            try:
                out[i] = complete(PP_G, "batch %d " % i * (5 + 11 * i), 24)
            except Exception as e:  # noqa: BLE001 (reported below)
                out[i] = ("failed: %s" % e, None, None)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        done = sum(1 for o in out if o[1] == "length")
        h.check(done == 8, "eight requests at once through the stages: %d/8 complete" % done)
    if N_GPU >= 4:  # stages of two GPUs (an NCCL communicator each) against one TP=2 group
        worker("tp", TP_W, ["--tensor-parallel-size", "2"])
        worker("pptp", PPTP_W, ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"])
        gateway("gtp", TP_G, TP_W)
        gateway("gpptp", PPTP_G, PPTP_W)
        if h.check(ready(TP_G, 300) and ready(PPTP_G, 300), "TP=2 and PP=2 x TP=2 on four GPUs serve"):
            same_answers(TP_G, PPTP_G, "PP=2 x TP=2 against TP=2")
    elif GPU:
        print("pp_gpu: PP=2 x TP=2 skipped: %d GPUs here, it needs 4" % N_GPU)
except Exception as e:  # noqa: BLE001 (a failure, said, not lost in the exit below)
    h.check(False, "the check ran to its end (%s: %s)" % (type(e).__name__, e))
finally:
    sys.exit(h.finish("pp_gpu"))
