#!/usr/bin/env python3
"""The cpu-small manifests, run: `podman kube play` starts the worker group's
leader (the LeaderWorkerSet's leader template as a Pod) and the gateway
Deployment from what deploy/gen.py renders, with the image this repo builds.

  kube_play.py BUILD MODEL IMAGE

What a cluster would give and podman does not is supplied, and only that:
host networking with free ports in place of pod IPs (the ports the
manifests name are moved, in args and probes alike), localhost for the
headless Service's DNS name, the model folder as a hostPath in
place of the init container's download. The probes the manifests declare
are then called as the kubelet would (their path and port). Checks: both
pods become ready on their probes; a chat request goes through the gateway
pod; the worker pod killed, the gateway says so (503) without hanging and
recovers when the pod is played again; SIGTERM to the gateway pod (within
its grace period) lets a running stream finish whole and the gateway exits 0.
"""
import copy, json, os, socket, subprocess, sys, tempfile, threading, time, urllib.request, urllib.error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402
import yaml  # noqa: E402
import gen  # noqa: E402

BUILD, MODEL, IMAGE = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
# this machine's podman cannot raise a container's open-file limit past its own: every container of a
# played pod (the infra one too) gets the limits image_test.sh passes with --ulimit
_conf = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
_conf.write('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
_conf.close()
os.environ["CONTAINERS_CONF"] = _conf.name
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    print(("ok  " if cond else "FAIL") + " " + what, flush=True)


def get(port, path, timeout=3):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def chat(port, max_tokens=8, timeout=60):
    body = json.dumps({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": max_tokens}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, body,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, None
    except OSError as e:
        return None, str(e)


def move_ports(ctr, moves):
    """Every port the container names (args, ports, probes) moved by moves {old: new}."""
    a = ctr.get("args", [])
    for i, x in enumerate(a):
        for old, new in moves.items():
            if x == str(old):
                a[i] = str(new)
            elif x.endswith(":%d" % old):
                a[i] = x[:-len(str(old))] + str(new)
    # on the host's network a container port is only a declaration, which podman 4 refuses to map: the
    # moved ports are in the args, and the probes are called on them
    ctr.pop("ports", None)


def probes(ctr):
    ports = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
    return {k: (ctr[k]["httpGet"]["path"], ports[ctr[k]["httpGet"]["port"]])
            for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in ctr}


def pod_doc(name, template, model_dir):
    spec = copy.deepcopy(template["spec"])
    spec["hostNetwork"] = True
    spec.pop("initContainers", None)
    spec.pop("topologySpreadConstraints", None)
    for v in spec.get("volumes", []):
        if v["name"] == "models":
            v.pop("emptyDir", None)
            v.pop("persistentVolumeClaim", None)
            v["hostPath"] = {"path": model_dir, "type": "Directory"}
    for c in spec["containers"]:  # the kubelet's probes are called by this test; podman's would need curl
        for k in ("startupProbe", "readinessProbe", "livenessProbe"):
            c.pop(k, None)
        c.pop("lifecycle", None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": template["metadata"]["labels"]},
            "spec": spec}


def play(doc, tmp, name):
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    r = subprocess.run(PODMAN + ["kube", "play", "--replace", path], capture_output=True, text=True)
    if r.returncode:
        print("podman kube play %s: %s" % (name, (r.stdout + r.stderr).strip()[-600:]))
    return r.returncode == 0


def wait(cond, secs):
    t = time.time()
    while time.time() - t < secs:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def main():
    v = copy.deepcopy(gen.PROFILES["cpu-small"])
    v["gateway"]["image"] = v["worker"]["image"] = IMAGE
    v["worker"]["fetchModel"] = False
    v["worker"]["imagePullPolicy"] = "Never"
    objs = gen.render(v)
    lws = [o for o in objs if o["kind"] == "LeaderWorkerSet"][0]
    dep = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-gateway")][0]
    svc = [o for o in objs if o["kind"] == "Service" and o["spec"].get("clusterIP") == "None"][0]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    wmoves = {gen.RPC: free_port(), gen.GROUP: free_port(), gen.PROBE: free_port()}
    gmoves = {gen.HTTP: free_port(), gen.RPC: wmoves[gen.RPC]}
    tmp = tempfile.mkdtemp(prefix="llmserve-kube-")
    wpod = pod_doc("llmserve-worker-0", leader, os.path.dirname(MODEL))
    wctr = wpod["spec"]["containers"][0]
    wprobes = probes(leader["spec"]["containers"][0])
    move_ports(wctr, wmoves)
    a = wctr["args"]
    a[a.index("--model") + 1] = "/models/" + os.path.basename(MODEL)
    a[a.index("--kv-cache-memory") + 1] = "256MiB"
    gpod = pod_doc("llmserve-gateway", dep["spec"]["template"], os.path.dirname(MODEL))
    gctr = gpod["spec"]["containers"][0]
    gprobes = probes(dep["spec"]["template"]["spec"]["containers"][0])
    move_ports(gctr, gmoves)
    # the headless Service's name: on the host's network (where podman keeps /etc/hosts and ignores
    # hostAliases) the name that resolves to the worker's address is localhost; --workers-dns still resolves it
    a = gctr["args"]
    i = a.index("--workers-dns") + 1
    check(a[i].startswith(svc["metadata"]["name"] + ":"), "the gateway finds the groups through the headless Service "
          "%s (%s)" % (svc["metadata"]["name"], a[i]))
    a[i] = "localhost:" + a[i].rsplit(":", 1)[1]
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    wpp = {k: (p, wmoves[port]) for k, (p, port) in wprobes.items()}
    gpp = {k: (p, gmoves[port]) for k, (p, port) in gprobes.items()}
    http = gmoves[gen.HTTP]
    try:
        check(play(wpod, tmp, "worker") and play(gpod, tmp, "gateway"),
              "kube play: the worker leader pod and the gateway pod start from the rendered manifests")
        ready = wait(lambda: all(get(port, path) == 200 for path, port in list(wpp.values()) + list(gpp.values())), 120)
        check(ready, "probes: every probe the manifests declare answers 200 (worker %s, gateway %s)" %
              ({k: get(port, p) for k, (p, port) in wpp.items()}, {k: get(port, p) for k, (p, port) in gpp.items()}))
        st, ans = chat(http)
        check(st == 200 and ans and ans["choices"][0]["message"]["content"] is not None,
              "chat: a request through the gateway pod is answered (%s)" % st)
        subprocess.run(PODMAN + ["pod", "rm", "-f", "-t", "0", "llmserve-worker-0"], capture_output=True)
        gone = wait(lambda: get(http, "/ready") == 503, 30)
        t = time.time()
        st, _ = chat(http, timeout=30)
        check(gone and st == 503 and time.time() - t < 10,
              "worker pod killed: the gateway is not ready and answers 503 at once (%s in %.1f s)" % (st, time.time() - t))
        play(wpod, tmp, "worker")
        back = wait(lambda: get(http, "/ready") == 200, 120)
        st, _ = chat(http)
        check(back and st == 200, "worker pod played again: the gateway finds it and serves again (%s)" % st)
        # a stream running while the gateway pod is stopped within its grace period
        events, done = [], threading.Event()

        def stream():
            body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story"}], "max_tokens": 120,
                               "ignore_eos": True, "stream": True}).encode()
            req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % http, body,
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    for line in r:
                        if line.startswith(b"data: "):
                            events.append(line[6:].strip())
            except OSError as e:
                events.append(("error: %s" % e).encode())
            done.set()
        th = threading.Thread(target=stream)
        th.start()
        wait(lambda: len(events) >= 3, 30)
        t = time.time()
        stop = subprocess.run(PODMAN + ["pod", "stop", "-t", str(grace), "llmserve-gateway"], capture_output=True,
                              text=True, timeout=grace + 30)
        done.wait(60)
        toks = sum(1 for e in events if e.startswith(b"{") and json.loads(e)["choices"] and
                   json.loads(e)["choices"][0]["delta"].get("content"))
        code = subprocess.run(PODMAN + ["inspect", "-f", "{{.State.ExitCode}}", "llmserve-gateway-gateway"],
                              capture_output=True, text=True).stdout.strip()
        check(stop.returncode == 0 and events and events[-1] == b"[DONE]" and toks >= 100 and code == "0",
              "SIGTERM within the grace period (%d s): the running stream finished whole (%d tokens, then [DONE]) "
              "and the gateway exited %s after %.1f s" % (grace, toks, code, time.time() - t))
    finally:
        if failures:
            for c in ("llmserve-worker-0-worker", "llmserve-gateway-gateway"):
                r = subprocess.run(PODMAN + ["logs", c], capture_output=True, text=True)
                print("---- %s\n%s" % (c, (r.stdout + r.stderr)[-1500:]))
        for name in ("llmserve-gateway", "llmserve-worker-0"):
            subprocess.run(PODMAN + ["pod", "rm", "-f", "-t", "0", name], capture_output=True)
    print("kube_play: %d checks failed" % len(failures))
    return 1 if failures else 0


sys.exit(main())
