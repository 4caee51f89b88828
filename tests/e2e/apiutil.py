"""What the API e2e scripts share: the gateway's address (GW), a check that
prints and counts, a plain JSON POST, the served model's id, and the exit."""
import json
import os
import sys
import urllib.request
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402

GW = os.environ["GW"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def post(path, body, timeout=120):
    """(status, JSON body) of a POST to the gateway; HTTP errors are answers too."""
    r = urllib.request.Request(GW + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=timeout) as f:
            return f.status, json.loads(f.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def model_id():
    with urllib.request.urlopen(GW + "/v1/models", timeout=10) as f:
        return json.loads(f.read())["data"][0]["id"]


def finish(name):
    print("%s: %d checks failed" % (name, len(failures)))
    sys.exit(1 if failures else 0)


def stop_and_check_logs(procs, logdir, what):
    """SIGTERM each process still running (a sanitizer build then runs its leak check), wait, then fail on any
    sanitizer report in the logs of logdir."""
    import glob
    import signal
    import subprocess
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    bad = []
    for f in glob.glob(logdir + "/*.log"):
        text = open(f, errors="replace").read()
        if "runtime error:" in text or "ERROR: AddressSanitizer" in text or "ERROR: LeakSanitizer" in text:
            bad.append(os.path.basename(f))
    check(not bad, "%s: no sanitizer report in the processes' logs%s" % (what, (" (" + ", ".join(bad) + ")") if bad else ""))


def healthy(port, t=60):
    """True once http://127.0.0.1:PORT/health answers 200, within t seconds."""
    import time
    end = time.time() + t
    while time.time() < end:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as f:
                if f.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(0.2)
    return False


def sse_events(sse):
    """[(event, data)] of a named-event SSE body."""
    out = []
    for block in sse.split("\n\n"):
        name = data = None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if name:
            out.append((name, data))
    return out
