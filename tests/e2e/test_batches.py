"""OpenAI's Files and Batch APIs (/v1/files, /v1/batches) with the `openai`
SDK, against real workers and gateways that share one files directory:

- upload, create, poll, download: every output line is the same greedy reply
  as the request sent directly; a bad request's answer is in the error file;
  request_counts, list, retrieve; another API key sees none of it; a file
  deleted is gone; an input that does not validate makes a failed batch
  naming its line; fields we do not honour are refused by name;
- through two gateways: created on one, retrieved and downloaded on the
  other;
- cancel: a long batch cancelled through the other gateway ends cancelled,
  its output holding exactly the requests finished;
- nothing accepted is lost: the gateway running a batch is killed (SIGKILL)
  mid-way, a torn half line is left at the end of its output, and the other
  gateway adopts the batch: every request's answer is in the output exactly
  once;
- /metrics counts the batch requests.

  test_batches.py BUILD_DIR MODEL
"""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("GW", "-")
from apiutil import check, finish, free_port, healthy, stop_and_check_logs  # noqa: E402

import openai  # noqa: E402

BUILD, MODEL = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="llmserve-batch-")
FILES = os.path.join(TMP, "files")
PROCS = {}


def start(name, args):
    log = open(os.path.join(TMP, name + ".log"), "a")
    PROCS[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


W = free_port()
start("worker", [BUILD + "/llmserve-worker", "--model", MODEL, "--kv-cache-memory", "256MiB", "--max-model-len", "2048",
                 "--log-level", "warn", "--listen", "tcp://127.0.0.1:%d" % W])
GP = [free_port(), free_port()]


def gateway(i, conc=2):
    start("gateway%d" % i, [BUILD + "/llmserve-gateway", "--port", str(GP[i]), "--workers", "tcp://127.0.0.1:%d" % W,
                            "--api-key", "k1", "--api-key", "k2", "--files-dir", FILES, "--batch-concurrency",
                            str(conc), "--log-level", "warn"])


def cl(i, key="k1"):
    return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % GP[i], api_key=key, timeout=60, max_retries=0)


def upload(c, lines):
    return c.files.create(file=("in.jsonl", io.BytesIO(("\n".join(json.dumps(x) for x in lines) + "\n").encode())),
                          purpose="batch")


def wait(c, bid, t=180):
    end = time.time() + t
    b = c.batches.retrieve(bid)
    while b.status not in ("completed", "failed", "cancelled", "expired") and time.time() < end:
        time.sleep(0.3)
        b = c.batches.retrieve(bid)
    return b


def lines_of(c, fid):
    return [json.loads(x) for x in c.files.content(fid).text.splitlines()] if fid else []


try:
    gateway(0)
    gateway(1)
    if not (healthy(GP[0]) and healthy(GP[1])):
        print("FAIL the gateways never came up; logs in", TMP)
        sys.exit(1)
    g0, g1 = cl(0), cl(1)
    M = g0.models.list().data[0].id

    def req(i, n=8):
        return {"model": M, "messages": [{"role": "user", "content": "Name %d things that are red." % (i % 7 + 1)}],
                "max_tokens": n, "temperature": 0}

    # ---- the round trip ---------------------------------------------------------------------------------
    reqs = [{"custom_id": "q%d" % i, "method": "POST", "url": "/v1/chat/completions", "body": req(i)} for i in range(12)]
    reqs.append({"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": M, "messages": [], "max_tokens": 4}})
    f = upload(g0, reqs)
    check(f.id.startswith("file-") and f.purpose == "batch" and f.bytes > 0, "upload: %s, %d bytes" % (f.id, f.bytes))
    b = g0.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                          metadata={"run": "e2e"})
    check(b.status == "in_progress" and b.request_counts.total == 13 and b.metadata == {"run": "e2e"},
          "create: in_progress, 13 requests")
    b = wait(g1, b.id)
    check(b.status == "completed" and b.request_counts.completed == 12 and b.request_counts.failed == 1
          and b.output_file_id and b.error_file_id and b.completed_at,
          "completed, seen through the other gateway: 12 completed, 1 failed")
    out = {x["custom_id"]: x for x in lines_of(g1, b.output_file_id)}
    same = len(out) == 12
    for i in range(12):
        direct = g0.chat.completions.create(**req(i)).choices[0].message.content
        got = out.get("q%d" % i, {}).get("response", {})
        same = same and got.get("status_code") == 200 and got["body"]["choices"][0]["message"]["content"] == direct
    check(same, "every output line: status 200 and the same greedy reply as the request sent directly")
    errs = lines_of(g0, b.error_file_id)
    check(len(errs) == 1 and errs[0]["custom_id"] == "bad" and errs[0]["response"]["status_code"] == 400
          and "messages" in errs[0]["response"]["body"]["error"]["message"], "the bad request's 400 in the error file")
    check(b.id in [x.id for x in g1.batches.list().data], "batches.list has it")
    o2 = cl(0, "k2")
    for what, fn in (("retrieve the batch", lambda: o2.batches.retrieve(b.id)),
                     ("read the output", lambda: o2.files.content(b.output_file_id))):
        try:
            fn()
            check(False, "another API key could " + what)
        except openai.NotFoundError:
            check(True, "another API key cannot %s (404)" % what)
    check(b.id not in [x.id for x in o2.batches.list().data] and not o2.files.list().data,
          "another API key lists none of it")
    g0.files.delete(f.id)
    try:
        g1.files.retrieve(f.id)
        check(False, "a deleted file is still there")
    except openai.NotFoundError:
        check(True, "files.delete: gone (404) through the other gateway")

    # ---- the same file offline: llmserve batch (vLLM's run_batch shape) ----------------------------------------
    fin, fout = os.path.join(TMP, "in.jsonl"), os.path.join(TMP, "out.jsonl")
    with open(fin, "w") as fo:
        fo.write("\n".join(json.dumps(x) for x in reqs) + "\n")
    r = subprocess.run([BUILD + "/llmserve", "batch", "-i", fin, "-o", fout, MODEL, "--kv-cache-memory", "256MiB",
                        "--max-model-len", "2048", "--log-level", "warn"], capture_output=True, text=True, timeout=300)
    off = [json.loads(x) for x in open(fout)] if r.returncode == 0 else []
    check(r.returncode == 0 and [x["custom_id"] for x in off] == [x["custom_id"] for x in reqs]
          and all(x["response"]["body"] == out[x["custom_id"]]["response"]["body"] or
                  x["response"]["body"]["choices"][0]["message"]["content"] ==
                  out[x["custom_id"]]["response"]["body"]["choices"][0]["message"]["content"]
                  for x in off if x["custom_id"] in out)
          and off[-1]["response"]["status_code"] == 400,
          "llmserve batch -i -o: the same answers offline, in input order (%s)" % r.stderr.strip().splitlines()[-1:])
    with open(fin, "a") as fo:
        fo.write('{"custom_id": "q0", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n')
    r = subprocess.run([BUILD + "/llmserve", "batch", "-i", fin, "-o", fout, MODEL], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode != 0 and "line 14: custom_id: used twice" in r.stderr,
          "llmserve batch: a bad file is refused before the model loads, naming its line (%s)" % r.stderr.strip()[:80])

    # ---- validation and refusals ---------------------------------------------------------------------------
    fb = upload(g0, [reqs[0], {"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {}}])
    bb = g0.batches.create(input_file_id=fb.id, endpoint="/v1/chat/completions", completion_window="24h")
    check(bb.status == "failed" and bb.errors and bb.errors.data[0].line == 2 and "method" in bb.errors.data[0].message,
          "an input that does not validate: failed, naming line 2 (%s)" % (bb.errors.data[0].message if bb.errors else ""))
    for body, param in (({"input_file_id": fb.id, "endpoint": "/v1/images", "completion_window": "24h"}, "endpoint"),
                        ({"input_file_id": fb.id, "endpoint": "/v1/completions", "completion_window": "1h"},
                         "completion_window"),
                        ({"input_file_id": "file-00", "endpoint": "/v1/completions", "completion_window": "24h"},
                         "input_file_id")):
        try:
            g0.batches.create(**body)
            check(False, "%s accepted" % param)
        except openai.APIStatusError as e:
            check(e.status_code in (400, 404) and getattr(e, "param", None) == param,
                  "refused by name: %s (%d)" % (param, e.status_code))

    # ---- cancel through the other gateway -------------------------------------------------------------------
    long = [{"custom_id": "c%d" % i, "method": "POST", "url": "/v1/chat/completions", "body": req(i, 48)}
            for i in range(150)]
    fc = upload(g0, long)
    bc = g0.batches.create(input_file_id=fc.id, endpoint="/v1/chat/completions", completion_window="24h")
    time.sleep(1.5)
    x = g1.batches.cancel(bc.id)
    check(x.status == "cancelling", "cancel through the other gateway: cancelling")
    bc = wait(g1, bc.id, 60)
    done = lines_of(g0, bc.output_file_id)
    check(bc.status == "cancelled" and 0 < bc.request_counts.completed < 150
          and len(done) == bc.request_counts.completed and bc.cancelled_at,
          "cancelled: its output holds exactly the %d requests finished" % bc.request_counts.completed)

    # ---- a gateway killed mid-batch: the other adopts it, nothing lost or doubled ---------------------------------
    fk = upload(g0, long)
    bk = g0.batches.create(input_file_id=fk.id, endpoint="/v1/chat/completions", completion_window="24h")
    time.sleep(2)
    PROCS["gateway1"].kill()  # the other must not take it before we are ready
    PROCS["gateway1"].wait()
    time.sleep(1)
    PROCS["gateway0"].kill()
    PROCS["gateway0"].wait()
    st = json.load(open(os.path.join(FILES, bk.id + ".json")))
    out_data = os.path.join(FILES, st["_output"] + ".data")
    had = sum(1 for _ in open(out_data)) if os.path.exists(out_data) else 0
    with open(out_data, "a") as fo:
        fo.write('{"id": "batch_req_torn", "custom_id": "c1')  # a write cut short
    gateway(1, conc=4)
    healthy(GP[1])
    bk = wait(g1, bk.id, 240)
    outk = lines_of(g1, bk.output_file_id)
    ids = [x["custom_id"] for x in outk]
    check(bk.status == "completed" and sorted(ids) == sorted("c%d" % i for i in range(150))
          and bk.request_counts.completed == 150 and 0 < had < 150,
          "killed mid-batch (%d of 150 done), torn line left: the other gateway adopted it, every answer once" % had)
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % GP[1], timeout=10) as f:
        m = f.read().decode()
    check('llmserve:batch_requests_total{result="completed"}' in m and "llmserve:batches_running 0" in m,
          "/metrics: batch requests counted, no batch running")
finally:
    stop_and_check_logs(list(PROCS.values()), TMP, "batches")
import apiutil  # noqa: E402
if not apiutil.failures:
    shutil.rmtree(TMP, ignore_errors=True)
else:
    print("logs kept in", TMP)
finish("test_batches")
