"""What the wire-level e2e tests (test_http.py, test_proxies.py) share: a
temporary folder for logs, processes started into it and always stopped, a
check that prints and counts, and the ending that prints the logs' tails
when something failed."""
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request


def get(port, path, timeout=5):
    """(status, body) of GET http://127.0.0.1:PORT/PATH; (None, "") when nothing answers."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return None, ""


def sse(lines):
    """The JSON events of a server-sent event stream (a response read line by line), up to [DONE]."""
    for line in lines:
        line = (line.decode() if isinstance(line, bytes) else line).strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def ready(port, t=120):
    """True once PORT's /ready answers 200, within t seconds."""
    end = time.time() + t
    while time.time() < end:
        if get(port, "/ready")[0] == 200:
            return True
        time.sleep(0.2)
    return False


class Harness:
    def __init__(self, prefix):
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.failures = []
        self.procs = []

    def check(self, cond, what):
        if not cond:
            self.failures.append(what)
        print(("ok  " if cond else "FAIL") + " " + what, flush=True)
        return cond

    def start(self, args, log):
        f = open(os.path.join(self.tmp, log), "w")
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=self.tmp)
        self.procs.append(p)
        return p

    def running(self):
        return all(p.poll() is None for p in self.procs)

    def finish(self, name, tail=20):
        """Stops every process; prints the count (and the logs on failure); the exit code."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
        print("%s: %d checks failed" % (name, len(self.failures)))
        if self.failures:
            for log in sorted(os.listdir(self.tmp)):
                if log.endswith(".log"):
                    lines = open(os.path.join(self.tmp, log), errors="replace").readlines()
                    print("---- %s (tail)" % log)
                    print("".join(lines[-tail:]))
        return 1 if self.failures else 0
