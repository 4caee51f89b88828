#!/usr/bin/env python3
"""The Kubernetes manifests (deploy/), checked without a cluster.

  test_manifests.py BUILD MODEL

  1. deploy/gen.py's output is what is committed;
  2. `kubectl kustomize` renders the base and every overlay, and each renders
     exactly the objects of its profile;
  3. the Helm chart, rendered by Helm's own engine (helm-python-sdk, Helm
     v4's Go SDK) with each profile's values file merged over values.yaml as
     `helm install -f` does, gives the same objects, so the chart and the
     overlays cannot drift; what Helm renders validates too, meets the API
     server's own rules (one source per volume, selectors that match, no
     replicas under an autoscaler, a startup probe that outlasts the
     worker's deadlines), and two releases share nothing;
  4. every object validates: core kinds against the Kubernetes schemas
     (kubernetes-validate, strict), the CRDs' specs against
     tests/deploy/schemas/ and their pod templates as core PodTemplates;
  5. every flag in every container's args is in that binary's --help, every
     probe and service port names a container port, and the probe paths and
     ports are what the binaries serve;
  6. the cpu-small profile's own worker and gateway flags start a loopback
     cluster (addresses moved to free loopback ports, the model to MODEL)
     that answers a chat request and drains on SIGTERM.
Exit 77 when kubectl or the Python packages are missing."""
import copy, json, os, re, shutil, socket, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402
try:
    import yaml
    import jsonschema
    import kubernetes_validate
except ImportError as e:
    print("test_manifests: %s (pip install kubernetes-validate pyyaml): skipped" % e)
    sys.exit(77)
if not shutil.which("kubectl"):
    print("test_manifests: kubectl not found: skipped")
    sys.exit(77)
_kv = subprocess.run(["kubectl", "version", "--client", "-o", "json"], capture_output=True, text=True)
try:
    _minor = int(re.sub(r"\D", "", json.loads(_kv.stdout)["clientVersion"]["minor"]))
except (ValueError, KeyError):
    _minor = 0
if _minor < 21:  # kustomize v4+ (the overlays' `patches`) is in kubectl 1.21 and later
    print("test_manifests: kubectl %s predates kustomize v4 (1.21+ needed): skipped" % _minor)
    sys.exit(77)
import gen

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
K8S_VERSION = "1.32.0"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    print(("ok  " if cond else "FAIL") + " " + what, flush=True)


def by_key(objs):
    return {gen.key(o): o for o in objs}


def kustomize(path):
    out = subprocess.run(["kubectl", "kustomize", path], capture_output=True, text=True)
    if out.returncode:
        return None, out.stderr.strip()
    return [o for o in yaml.safe_load_all(out.stdout) if o], ""


# ---- the chart through Helm's own engine (helm-python-sdk: Helm v4's Go SDK) ----------
try:
    import helm_python
except ImportError:
    helm_python = None
CHART = os.path.join(ROOT, "deploy/helm/llmserve")


def helm_objects(values_file=None, name="llmserve", namespace="default"):
    """The chart rendered as `helm install NAME CHART -n NAMESPACE [-f values_file]` would: the file
    merged over values.yaml by Helm itself."""
    over = yaml.safe_load(open(os.path.join(CHART, values_file))) if values_file else {}
    with helm_python.Chart.load(CHART) as c:
        rendered = c.render(over or {}, name=name, namespace=namespace)
    objs = []
    for fn in sorted(rendered):
        objs += [o for o in yaml.safe_load_all(rendered[fn]) if o]
    return objs


def diff_keys(a, b):
    return sorted(set(a) ^ set(b)) + sorted(k for k in set(a) & set(b) if a[k] != b[k])


# ---- what the API server checks beyond the schemas ---------------------------------------
def pod_specs(o):
    s = o.get("spec", {})
    return [t for t in pod_templates(o) or ([s["template"]] if "template" in s else [])]


VOLUME_SOURCES = {"emptyDir", "persistentVolumeClaim", "secret", "configMap", "hostPath", "projected", "ephemeral",
                  "downwardAPI", "csi", "nfs"}


def api_rules(objs):
    """One source per volume; a workload's selector matches its pod template; a Service, PDB or HPA/KEDA
    target names something the objects make; replicas left to the autoscaler that owns them."""
    bad = []
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for o in objs:
        for t in pod_specs(o):
            for v in t["spec"].get("volumes", []):
                n = len(VOLUME_SOURCES & set(v))
                if n != 1:
                    bad.append("%s: volume %s has %d sources (%s)" % (gen.key(o), v["name"], n, sorted(set(v) - {"name"})))
        sel = o.get("spec", {}).get("selector", {})
        if o["kind"] in ("Deployment", "StatefulSet"):
            lab = o["spec"]["template"]["metadata"]["labels"]
            if any(lab.get(k) != x for k, x in sel["matchLabels"].items()):
                bad.append("%s: the selector does not match its pod template" % gen.key(o))
        if o["kind"] in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
            want = o["spec"].get("selector") if o["kind"] == "Service" else \
                (o["spec"].get("selector") or o["spec"].get("podSelector", {})).get("matchLabels")
            pods = [t["metadata"]["labels"] for x in objs for t in pod_specs(x)]
            if want and not any(all(p.get(k) == x for k, x in want.items()) for p in pods):
                bad.append("%s: its selector matches no pod the objects make" % gen.key(o))
        if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"):
            ref = o["spec"]["scaleTargetRef"]
            target = [x for x in objs if x["kind"] == ref.get("kind", "Deployment") and x["metadata"]["name"] == ref["name"]]
            if not target:
                bad.append("%s: scales %s %s, which is not made" % (gen.key(o), ref.get("kind"), ref["name"]))
            elif "replicas" in target[0]["spec"]:
                bad.append("%s: %s sets spec.replicas, which its autoscaler owns (every apply would reset it)" %
                           (gen.key(target[0]), gen.key(target[0])))
        if o["kind"] == "PodDisruptionBudget":  # a budget that allows no eviction blocks every node drain
            sp = o["spec"]
            mu, ma = sp.get("maxUnavailable"), sp.get("minAvailable")
            if mu in (0, "0", "0%") or ma not in (None, 0, "0", "0%"):
                bad.append("%s: %s lets no pod be evicted when a workload runs at one replica (a drain never "
                           "ends); use maxUnavailable: 1" % (gen.key(o), "maxUnavailable 0" if mu is not None else
                                                             "minAvailable %s" % ma))
        if o["kind"] == "ScaledObject":  # KEDA's semantics, which no schema states
            beh = o["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
            win = beh.get("scaleDown", {}).get("stabilizationWindowSeconds", 0)
            if win < 600:  # cooldownPeriod only delays scaling to zero; N -> fewer waits for the HPA's window
                bad.append("%s: scale-down waits %s s (the HPA's stabilizationWindowSeconds), not the 10 minutes "
                           "docs/deploy.md promises" % (gen.key(o), win))
            for t in o["spec"].get("triggers", []):
                q = t.get("metadata", {}).get("query", "")
                # every gateway reports every group's queue: a sum counts it once a gateway; one gateway's view
                # (max) of this release's namespace and service only, or any vLLM on the Prometheus feeds it
                if t.get("type") == "prometheus" and not (q.startswith("max(") and "namespace=" in q and
                                                          "service=" in q):
                    bad.append("%s: the queue query %r over-counts or reaches other releases" % (gen.key(o), q))
    owners = {}  # no pod is claimed by two workload controllers' selectors (they would fight over it)
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet"):
            for x in objs:
                for t in pod_specs(x):
                    if all(t["metadata"]["labels"].get(k) == v for k, v in o["spec"]["selector"]["matchLabels"].items()):
                        owners.setdefault(gen.key(x) + "/" + str(id(t)), []).append(gen.key(o))
    bad += ["pods of %s are selected by %s" % (k.split("/")[0], v) for k, v in owners.items() if len(set(v)) > 1]
    for o in objs:  # the startup probe outlasts the worker's own deadlines, which end a stalled start first
        for t in pod_specs(o):
            for c in t["spec"]["containers"]:
                a = c.get("args", [])
                if c["command"][0] == "llmserve-worker" and "startupProbe" in c:
                    sp = c["startupProbe"]
                    budget = sp["periodSeconds"] * sp["failureThreshold"]
                    need = float(arg_value(a, "--join-timeout") or 0) + float(arg_value(a, "--load-timeout") or 0)
                    if not need or budget < need:
                        bad.append("%s: the startup probe's %d s do not outlast --join-timeout + --load-timeout (%g s)"
                                   % (gen.key(o), budget, need))
    return bad


# ---- schemas ------------------------------------------------------------------
SCHEMAS = {k: json.load(open(os.path.join(ROOT, "tests/deploy/schemas", f))) for k, f in
           (("LeaderWorkerSet", "leaderworkerset.json"), ("ScaledObject", "scaledobject.json"),
            ("InferencePool", "inferencepool.json"), ("ServiceMonitor", "servicemonitor.json"),
            ("PrometheusRule", "prometheusrule.json"), ("PodMonitor", "podmonitor.json"))}


def pod_templates(o):
    s = o["spec"]
    if o["kind"] == "LeaderWorkerSet":
        t = s["leaderWorkerTemplate"]
        return [t["leaderTemplate"], t["workerTemplate"]]
    return []


def validate(o):
    kind = o["kind"]
    if kind in SCHEMAS:
        errs = [e.message for e in jsonschema.Draft202012Validator(SCHEMAS[kind]).iter_errors(o)]
        for t in pod_templates(o):
            try:
                kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                              "template": t}, K8S_VERSION, strict=True)
            except Exception as e:  # noqa: BLE001 - the validator's own error types
                errs.append(str(e)[:300])
        return errs
    try:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        return []
    except Exception as e:  # noqa: BLE001
        return [str(e)[:300]]


# ---- flags and ports ----------------------------------------------------------------
HELP = {}


def help_flags(binary):
    if binary not in HELP:
        out = subprocess.run([os.path.join(BUILD, binary), "--help"], capture_output=True, text=True)
        HELP[binary] = set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout + out.stderr))
    return HELP[binary]


SERVED = {"llmserve-worker": {"/live", "/ready", "/health", "/metrics"},
          "llmserve-gateway": {"/live", "/ready", "/health", "/metrics"}}


def containers(o):
    spec = o.get("spec", {})
    pods = pod_templates(o) or ([spec["template"]] if "template" in spec else [])
    for p in pods:
        for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]:
            yield c


def arg_value(args, flag):
    return args[args.index(flag) + 1] if flag in args else None


def flag_checks(name, objs):
    bad = []
    for o in objs:
        for c in containers(o):
            binary = c["command"][0]
            args = c.get("args", [])
            if binary in ("llmserve-worker", "llmserve-gateway"):
                known = help_flags(binary)
                bad += ["%s: %s %s" % (c["name"], binary, a) for a in args if a.startswith("--") and a not in known]
                ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
                served_port = int(arg_value(args, "--health-port" if binary == "llmserve-worker" else "--port"))
                for pk in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if pk not in c:
                        continue
                    g = c[pk]["httpGet"]
                    if g["path"] not in SERVED[binary]:
                        bad.append("%s %s: %s is not served" % (c["name"], pk, g["path"]))
                    if ports.get(g["port"]) != served_port:
                        bad.append("%s %s: port %s is not the one %s serves (%d)" % (c["name"], pk, g["port"], binary,
                                                                                    served_port))
                if binary == "llmserve-worker":
                    listen = arg_value(args, "--listen")
                    if "rpc" in ports and not listen.endswith(":%d" % ports["rpc"]):
                        bad.append("worker: --listen %s is not its rpc port %d" % (listen, ports["rpc"]))
            elif binary not in ("llmserve-fetch-model", "llmserve", "sleep"):
                bad.append("%s: %s is not in the image" % (c["name"], binary))
    # the grace period covers the preStop pause and the drain (--shutdown-timeout)
    for o in objs:
        spec = o.get("spec", {})
        for pod in pod_templates(o) or ([spec["template"]] if "template" in spec else []):
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            for c in pod["spec"]["containers"]:
                st = arg_value(c.get("args", []), "--shutdown-timeout")
                pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
                need = (int(pre[1]) if pre[:1] == ["sleep"] else 0) + (int(st) if st else 0)
                if grace < need:
                    bad.append("%s: terminationGracePeriodSeconds %d < preStop + --shutdown-timeout %d" % (
                        c["name"], grace, need))
    # the worker RPC (7600) and the group's join (7700) are reachable from pods of the namespace only
    for o in objs:
        if o["kind"] != "NetworkPolicy":
            continue
        for rule in o["spec"].get("ingress", []):
            ports = {p.get("port") for p in rule.get("ports", [])}
            if (not rule.get("ports") or ports & {gen.RPC, gen.GROUP}) and \
                    any(set(peer) - {"podSelector"} for peer in rule.get("from", [{}])):
                bad.append("networkpolicy: a rule opens %s beyond the namespace's pods" % (sorted(ports) or "every port"))
    # a Service's targetPort names a port of the pods it selects
    named = set()
    for o in objs:
        for c in containers(o):
            named |= {p["name"] for p in c.get("ports", [])}
    for o in objs:
        if o["kind"] == "Service":
            for p in o["spec"]["ports"]:
                if isinstance(p["targetPort"], str) and p["targetPort"] not in named:
                    bad.append("service %s: targetPort %s is no container's" % (o["metadata"]["name"], p["targetPort"]))
    check(not bad, "%s: flags are in the binaries' --help, probes and services name the ports served, grace periods "
          "cover the drain, the RPC stays in the namespace%s" %
          (name, "" if not bad else " (%s)" % bad[:4]))


# ---- the loopback cluster from the manifests' own flags -------------------------


def loopback(objs, name="cpu-small"):
    """The profile's worker sets (the LWS's leader; cpu-pd: and the prefill Deployment's pod) and its gateway,
    from their own flags, on loopback."""
    if not os.path.exists(MODEL):
        print("test_manifests: model %s not found: loopback part skipped" % MODEL)
        return
    lws = [o for o in objs if o["kind"] == "LeaderWorkerSet"][0]
    sets = [lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]] + \
        [o["spec"]["template"]["spec"]["containers"][0]["args"] for o in objs
         if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-prefill")]
    gw = [o for o in objs if o["kind"] == "Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    gargs = copy.copy(gw)
    http = free_port()
    tmp = tempfile.mkdtemp(prefix="llmserve-manifest-")
    ws, probes, rpcs = [], [], []
    for k, a in enumerate(sets):
        wargs = copy.copy(a)
        rpc, probe_p, group = free_port(), free_port(), free_port()
        subst = {"--model": MODEL, "--listen": "tcp://127.0.0.1:%d" % rpc, "--health-port": str(probe_p),
                 "--group-address": "tcp://127.0.0.1:%d" % group, "--kv-cache-memory": "256MiB"}
        for f, v in subst.items():
            wargs[wargs.index(f) + 1] = v
        if "--kv-offloading-dir" in wargs:  # the pod's emptyDir at /kv: here, a folder of our own
            wargs[wargs.index("--kv-offloading-dir") + 1] = os.path.join(tmp, "kv%d" % k)
        ws.append(subprocess.Popen([os.path.join(BUILD, "llmserve-worker")] + wargs + ["--health-host", "127.0.0.1"],
                                   stdout=open(os.path.join(tmp, "w%d.log" % k), "w"), stderr=subprocess.STDOUT))
        probes.append(probe_p)
        rpcs.append("tcp://127.0.0.1:%d" % rpc)
        tpl = lws["spec"]["leaderWorkerTemplate"]
        for idx in range(1, tpl.get("size", 1) if k == 0 else 1):  # the group's other pods, from their own flags
            fargs = [x.replace("$(LWS_WORKER_INDEX)", str(idx)).replace("$(LWS_LEADER_ADDRESS)", "127.0.0.1")
                     for x in tpl["workerTemplate"]["spec"]["containers"][0]["args"]]
            fsub = {"--model": MODEL, "--listen": "tcp://127.0.0.1:%d" % free_port(), "--health-port": "0",
                    "--group-address": "tcp://127.0.0.1:%d" % group, "--kv-cache-memory": "256MiB"}
            for f, v in fsub.items():
                fargs[fargs.index(f) + 1] = v
            ws.append(subprocess.Popen([os.path.join(BUILD, "llmserve-worker")] + fargs,
                                       stdout=open(os.path.join(tmp, "w%d-%d.log" % (k, idx)), "w"),
                                       stderr=subprocess.STDOUT))
    probe_p = probes[0]
    i = gargs.index("--workers-dns")  # the headless Service's name resolves to the leaders: here, their addresses
    gargs[i:i + 2] = ["--workers", ",".join(rpcs)]
    gargs[gargs.index("--host") + 1] = "127.0.0.1"
    gargs[gargs.index("--port") + 1] = str(http)
    g = subprocess.Popen([os.path.join(BUILD, "llmserve-gateway")] + gargs, stdout=open(os.path.join(tmp, "g.log"), "w"),
                         stderr=subprocess.STDOUT)
    try:
        def get(port, path):
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=2) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code
            except OSError:
                return None

        def ready():
            return all(get(p, "/ready") == 200 for p in probes) and get(http, "/ready") == 200
        t = time.time()
        while time.time() - t < 90 and not ready():
            time.sleep(0.2)
        check(ready(), "loopback: the %s flags start %d worker set(s) and a gateway, ready on their probe paths" %
              (name, len(sets)))
        body = json.dumps({"model": arg_value(sets[0], "--served-model-name"), "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}).encode()
        req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % http, body,
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                ans = json.loads(r.read())
            ok = ans["choices"][0]["message"]["content"] is not None
        except OSError as e:
            ok, ans = False, str(e)
        check(ok, "loopback: a chat request through them is answered")
        size = lws["spec"]["leaderWorkerTemplate"].get("size", 1)
        if size > 1:  # pods are hosts: their ranks share no memory and meet over TCP
            log = open(os.path.join(tmp, "w0.log"), errors="replace").read()
            pp = int(arg_value(sets[0], "--pipeline-parallel-size") or 1)
            tp = int(arg_value(sets[0], "--tensor-parallel-size") or 1)
            per = int(arg_value(sets[0], "--ranks-per-node") or 1)
            staged = pp == 1 or ("pipeline stage 0 of %d" % pp in log and
                                 (tp == 1 or "%d pipeline stages of %d ranks: each stage's collectives over shared "
                                  "memory, the stages' hops over TCP" % (pp, tp) in log))
            check("collectives go over TCP" in log and staged,
                  "loopback: the %s group's %d pods (%d ranks each) form one %s group over TCP" %
                  (name, size, per, "PP=%d x TP=%d" % (pp, tp) if pp > 1 else "TP=%d" % tp))
        if len(sets) > 1:  # P/D: a prompt past maxLocalPrefillLength is prefilled by the prefill set, decoded here
            n = int(arg_value(gargs, "--max-local-prefill-length")) + 100
            body = json.dumps({"model": arg_value(sets[0], "--served-model-name"), "prompt": [1000 + i % 5000 for i in range(n)],
                               "max_tokens": 8, "temperature": 0}).encode()
            req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % http, body,
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    ans = json.loads(r.read())
                ok = ans["usage"]["completion_tokens"] == 8
            except OSError as e:
                ok, ans = False, str(e)
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % http, timeout=5) as r:
                gm = r.read().decode()
            hand = re.search(r"^llmserve:disagg_handoffs_total\S* (\d+)", gm, re.M)
            roles = re.findall(r'^llmserve:worker_kv_role\{[^}]*role="(\w+)"[^}]*\} 1', gm, re.M)
            check(ok and hand and int(hand.group(1)) == 1 and sorted(roles) == ["kv_consumer", "kv_producer"],
                  "loopback P/D: a %d-token prompt is prefilled by the prefill set and decoded by the worker set "
                  "(handoffs %s, roles %s)" % (n, hand and hand.group(1), roles))
        # the group's own /metrics, where the PodMonitor scrapes it (its probe port)
        pm = [o for o in gen.render(gen.PROFILES["gpu-8b"]) if o["kind"] == "PodMonitor"][0]
        ep = pm["spec"]["podMetricsEndpoints"][0]
        wtext = ""
        for _ in range(20):
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d%s" % (probe_p, ep["path"]), timeout=5) as r:
                    wtext = r.read().decode()
            except OSError:
                pass
            if "vllm:generation_tokens_total" in wtext and not re.search(r"generation_tokens_total\S* 0$", wtext, re.M):
                break
            time.sleep(0.5)
        check(ep["port"] == "probe" and re.search(r"^vllm:num_requests_waiting\{[^}]*\} 0$", wtext, re.M) and
              re.search(r"^vllm:generation_tokens_total\{[^}]*\} [1-9]", wtext, re.M),
              "worker metrics: the group's own /metrics on its probe port count the request (%s)" %
              re.findall(r"^vllm:generation_tokens_total.*$", wtext, re.M))
        # every metric the dashboard, the adapter rules and the KEDA trigger read is one the gateway serves
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % http, timeout=5) as r:
            text = r.read().decode()
        served = set(re.findall(r"^([a-z0-9_:]+?)(?:\{| )", text, re.M))
        per_worker = set(re.findall(r'^([a-z0-9_:]+)\{[^}]*worker="', text, re.M))
        dash = json.load(open(os.path.join(ROOT, "deploy/grafana/llmserve-dashboard.json")))
        unlabelled = [m for p in dash["panels"] for t in p.get("targets", []) if "by (worker)" in t["expr"]
                      for m in re.findall(r"((?:llmserve|vllm):[a-z0-9_]+)", t["expr"])
                      if re.sub(r"_total$", "", m) not in {re.sub(r"_total$", "", x) for x in per_worker}]
        check(not unlabelled, "dashboard: every per-group panel reads series that carry a worker label%s" %
              (" (not: %s)" % sorted(set(unlabelled)) if unlabelled else ""))
        used = set()
        for f in ("deploy/grafana/llmserve-dashboard.json", "deploy/k8s/extras/prometheus-adapter-rules.yaml"):
            used |= set(re.findall(r"(?<![/\w])((?:llmserve|vllm):[a-z0-9_]+)", open(os.path.join(ROOT, f)).read()))
        for prof in gen.PROFILES.values():
            used |= set(re.findall(r"(?<![/\w])((?:llmserve|vllm):[a-z0-9_]+)", json.dumps(gen.render(prof))))
        # the model-server protocol GIE's endpoint picker scrapes (the inference-pool profile's sidecars)
        used |= {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info"}
        missing = sorted(m for m in used if m not in served)
        check(not missing, "metrics: the %d metrics the dashboard, adapter rules, alerts, KEDA and GIE's endpoint "
              "picker read are served%s" %
              (len(used), " (missing: %s)" % missing if missing else ""))
        g.terminate()
        for w in ws:
            w.terminate()
        check(g.wait(40) == 0 and all(w.wait(70) == 0 for w in ws), "loopback: all drain and exit 0 on SIGTERM")
    finally:
        for p in [g] + ws:
            if p.poll() is None:
                p.kill()
        if failures:
            for n in ["w%d.log" % k for k in range(len(ws))] + ["g.log"]:
                print("---- %s\n%s" % (n, open(os.path.join(tmp, n)).read()[-1500:]))


def main():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "deploy/gen.py"), "--check"], capture_output=True, text=True)
    check(r.returncode == 0, "gen: the committed manifests and chart are what deploy/gen.py writes (%s)" %
          (r.stdout + r.stderr).strip()[:200])
    cases = [("base", "deploy/k8s/base", gen.BASE)] + \
        [(n, "deploy/k8s/overlays/" + n, v) for n, v in gen.PROFILES.items()]
    for name, path, values in cases:
        want = by_key(gen.render(values))
        got, err = kustomize(os.path.join(ROOT, path))
        check(got is not None, "%s: kubectl kustomize renders it%s" % (name, " (%s)" % err[:200] if err else ""))
        if got is None:
            continue
        got = by_key(got)
        d = diff_keys(want, got)
        check(not d, "%s: the overlay renders exactly the profile's %d objects%s" % (name, len(want), " (differ: %s)" % d if d else ""))
        vf = None if name == "base" else "values-%s.yaml" % name
        if helm_python:
            try:
                hobjs = helm_objects(vf)
                d = diff_keys(want, by_key(hobjs))
            except Exception as e:  # noqa: BLE001 - Helm's own errors
                hobjs, d = [], ["render: %s" % str(e)[:300]]
            check(not d, "%s: helm install with %s (Helm %s merging it over values.yaml) gives the same objects%s" %
                  (name, vf or "values.yaml", helm_python.helm_sdk_version(), " (differ: %s)" % d[:4] if d else ""))
            herrs = {gen.key(o): validate(o) for o in hobjs}
            herrs = {k: e for k, e in herrs.items() if e}
            check(not herrs, "%s: every object Helm renders validates%s" % (name, " %s" % herrs if herrs else ""))
            bad = api_rules(hobjs)
            check(not bad, "%s: the API server's own rules hold for what Helm renders%s" % (name, " %s" % bad[:4] if bad else ""))
        if name == "base":  # the extras too: the adapter's rules and the HPA for worker groups
            for f in sorted(os.listdir(os.path.join(ROOT, "deploy/k8s/extras"))):
                for o in yaml.safe_load_all(open(os.path.join(ROOT, "deploy/k8s/extras", f))):
                    e = validate(o)
                    check(not e, "extras: %s (%s) validates%s" % (f, o["kind"], " %s" % e if e else ""))
        errs = {k: validate(o) for k, o in got.items()}
        errs = {k: e for k, e in errs.items() if e}
        check(not errs, "%s: every object validates (%s)%s" % (name, ", ".join(sorted(got)), " %s" % errs if errs else ""))
        flag_checks(name, list(got.values()))
    # GIE's chart values select the inference-pool profile's leaders on their sidecar's port; the route names
    # the pool that chart makes
    gv = yaml.safe_load(open(os.path.join(ROOT, "deploy/gie/inferencepool-values.yaml")))
    route = yaml.safe_load(open(os.path.join(ROOT, "deploy/gie/httproute.yaml")))
    ip = gen.render(gen.PROFILES["inference-pool"])
    leaders = [t for o in ip for t in pod_specs(o) if t["metadata"]["labels"].get("llmserve.io/role") == "leader"]
    sel = gv["inferencePool"]["modelServers"]["matchLabels"]
    ports = {p["containerPort"] for t in leaders for c in t["spec"]["containers"] if c["name"] == "gateway"
             for p in c.get("ports", [])}
    pods = [t["metadata"]["labels"] for o in ip for t in pod_specs(o)]
    check(leaders and all(all(t["metadata"]["labels"].get(k) == v for k, v in sel.items()) for t in leaders) and
          sum(all(p.get(k) == v for k, v in sel.items()) for p in pods) == len(leaders) and
          {p["number"] for p in gv["inferencePool"]["targetPorts"]} <= ports and
          route["spec"]["rules"][0]["backendRefs"][0]["kind"] == "InferencePool",
          "gie: the inferencepool chart's values select exactly the leaders, on their gateway sidecar's port %s" % sorted(ports))
    # the memory arithmetic in the GPU profiles' values files is what `llmserve plan` says today
    for name, note in gen.NOTES.items():
        lines = note.split("\n")
        cmd = ""
        while lines and (not cmd or cmd.endswith("\\")):
            cmd = cmd.rstrip("\\ ") + " " + lines.pop(0).strip()
        args = cmd.split()[2:]
        out = subprocess.run([os.path.join(BUILD, "llmserve"), "plan"] + args, capture_output=True, text=True).stdout
        pool = re.search(r"KV pool per GPU:\s+([\d.]+) GiB", out)
        seqs = re.search(r"sequences at once: (\d+)", out)
        mml = int(args[args.index("--max-model-len") + 1])
        ok = pool and seqs and (pool.group(1) + " GiB") in note and (" %s full" % seqs.group(1)) in note and \
            mml == gen.PROFILES[name]["worker"]["maxModelLen"] and \
            int(args[args.index("--tensor-parallel-size") + 1] if "--tensor-parallel-size" in args else 1) == \
            gen.PROFILES[name]["worker"]["tensorParallelSize"] and \
            int(args[args.index("--pipeline-parallel-size") + 1] if "--pipeline-parallel-size" in args else 1) == \
            gen.PROFILES[name]["worker"].get("pipelineParallelSize", 1)
        check(ok, "plan: %s's memory notes match llmserve plan (KV pool %s GiB, %s sequences)" %
              (name, pool and pool.group(1), seqs and seqs.group(1)))
    # 70B over two nodes: TP within a node (8 GPUs a pod), PP across them (a stage a pod of the LWS group)
    mn = by_key(gen.render(gen.PROFILES["multinode-70b-tp8-pp2"]))["leaderworkerset-llmserve-worker"]["spec"]
    margs = mn["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
    flag = lambda f: margs[margs.index(f) + 1] if f in margs else None  # noqa: E731
    check(mn["leaderWorkerTemplate"]["size"] == 2 and flag("--tensor-parallel-size") == "8" and
          flag("--pipeline-parallel-size") == "2" and flag("--device") == "cuda",
          "multinode-70b-tp8-pp2: an LWS group of 2 pods, TP=8 x PP=2 on CUDA (%s, %s, size %s)" %
          (flag("--tensor-parallel-size"), flag("--pipeline-parallel-size"), mn["leaderWorkerTemplate"]["size"]))
    # the GPU profiles' model storage: the claim the chart makes, filled by a download Job (here from a local
    # HTTP server, the way the Job's container runs it), the workers mounting that claim and loading that file
    v = copy.deepcopy(gen.PROFILES["gpu-8b"])
    sha = subprocess.run(["sha256sum", MODEL], capture_output=True, text=True).stdout.split()[0] if os.path.exists(MODEL) else "0" * 64
    v["worker"]["modelDownload"] = {"url": "http://127.0.0.1:1/m.gguf", "sha256": sha, "file": "m.gguf", "tokenSecret": "hf"}
    v["worker"]["model"] = "/models/m.gguf"
    objs = by_key(gen.render(v))
    job, pvc = objs.get("job-llmserve-fetch-model"), objs.get("persistentvolumeclaim-llmserve-models-8b")
    lws = objs["leaderworkerset-llmserve-worker"]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    claim = [x for x in lws["volumes"] if x["name"] == "models"][0]["persistentVolumeClaim"]["claimName"]
    errs = [e for o in (job, pvc) if o for e in validate(o)] + api_rules(list(objs.values()))
    check(job and pvc and not errs and claim == pvc["metadata"]["name"] ==
          job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] and
          job["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "m.gguf" and
          arg_value(lws["containers"][0]["args"], "--model") == "/models/m.gguf",
          "model storage: the GPU profile's claim, its download Job and the workers agree (%s)" % errs[:2])
    if os.path.exists(MODEL):  # the Job's command, run: a local server, a good checksum and a bad one
        srv = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
                               cwd=os.path.dirname(MODEL), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        port = int(re.search(r"port (\d+)", srv.stdout.readline()).group(1))
        dst = tempfile.mkdtemp(prefix="llmserve-fetch-")
        url = "http://127.0.0.1:%d/%s" % (port, os.path.basename(MODEL))
        fm = os.path.join(ROOT, "tools/fetch_model.sh")
        good = subprocess.run(["bash", fm, dst, "url", url, sha, "m.gguf"], capture_output=True, text=True)
        bad = subprocess.run(["bash", fm, dst, "url", url, "0" * 64, "n.gguf"], capture_output=True, text=True)
        srv.terminate()
        check(good.returncode == 0 and os.path.getsize(os.path.join(dst, "m.gguf")) == os.path.getsize(MODEL) and
              bad.returncode != 0 and not os.path.exists(os.path.join(dst, "n.gguf")),
              "model download: the Job's command keeps a file with its sha256 and refuses one without (%s)" %
              bad.stderr.strip()[-80:])
        shutil.rmtree(dst, ignore_errors=True)
    if helm_python:  # two releases in one namespace: nothing shared, no selector reaching the other's pods
        a, b = helm_objects(None, "alpha"), helm_objects(None, "beta")
        shared = {(o["kind"], o["metadata"]["name"]) for o in a} & {(o["kind"], o["metadata"]["name"]) for o in b}
        cross = []
        for x, y in ((a, b), (b, a)):
            pods = [t["metadata"]["labels"] for o in y for t in pod_specs(o)]
            for o in x:
                sel = o.get("spec", {}).get("selector")
                sel = sel.get("matchLabels", sel) if isinstance(sel, dict) else None
                if sel and any(all(p.get(k) == v for k, v in sel.items()) for p in pods):
                    cross.append(gen.key(o))
        check(not shared and not cross, "releases: two releases of the chart share no object name and select none "
              "of each other's pods (shared %s, crossing %s)" % (sorted(shared)[:3], cross[:3]))
    else:
        print("test_manifests: helm-python-sdk not installed: the chart was not rendered with Helm (skipped)")
    loopback(gen.render(gen.PROFILES["cpu-small"]))
    loopback(gen.render(gen.PROFILES["cpu-pd"]), "cpu-pd")
    loopback(gen.render(gen.PROFILES["cpu-multinode"]), "cpu-multinode")


main()
print("test_manifests: %d checks failed" % len(failures))
sys.exit(1 if failures else 0)
