#!/usr/bin/env python3
"""The one source of llmserve's Kubernetes manifests.

  python3 deploy/gen.py            writes deploy/k8s/ and deploy/helm/llmserve/
  python3 deploy/gen.py --check    exits 1 if what is committed differs

The objects are written once, below, as functions of a values tree (the
Helm chart's values.yaml). From them come:
  - deploy/k8s/base/: the objects for BASE's values, and a kustomization;
  - deploy/k8s/overlays/NAME/: for each profile, JSON patches (RFC 6902)
    that turn the base into that profile's objects, plus its own objects
    and deletions: a kustomization that renders exactly the profile;
  - deploy/helm/llmserve/: the same objects as Helm templates (each value a
    {{ .Values.x }} lookup, each optional object or list item inside an
    {{ if }}), values.yaml = BASE, values-NAME.yaml per profile.
tests/deploy/test_manifests.py renders both ways and checks that they agree,
so the chart and the overlays cannot drift. Needs PyYAML."""
import copy, json, os, sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
RPC, GROUP, PROBE, HTTP = 7600, 7700, 8081, 8000

# ---- values ---------------------------------------------------------------
BASE = {
    "gateway": {
        "enabled": True,
        "image": "localhost/llmserve:cpu",
        "replicas": 2,
        "serviceType": "LoadBalancer",
        "maxQueue": 512,
        "requestTimeout": 600,
        "shutdownTimeout": 30,
        "terminationGracePeriodSeconds": 45,   # preStop 5 s + --shutdown-timeout 30 + 10 to spare
        "apiKeysSecret": "",                   # a Secret with a "keys" file: --api-keys-file
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 10, "targetCPUUtilization": 70,
                        "targetOpenStreams": 200},
    },
    "worker": {
        "image": "localhost/llmserve:cpu",
        "imagePullPolicy": "IfNotPresent",
        "lws": True,                            # a LeaderWorkerSet; false: a StatefulSet (one pod a group)
        "groups": 1,                            # replicas of the model (worker groups)
        "nodes": 1,                             # pods per group (LWS size)
        "ranksPerNode": 1,                      # ranks (GPUs) per pod
        "tensorParallelSize": 1,                # nodes x ranksPerNode
        "model": MODEL,
        "servedModelName": "SmolLM2-135M-Instruct",
        "device": "cpu",
        "maxModelLen": 2048,
        "maxNumSeqs": 64,
        "kvCacheMemory": "1GiB",
        "gpuMemoryUtilization": 0.9,
        "kvCacheDtype": "auto",
        "quantization": "",
        "shutdownTimeout": 60,
        "terminationGracePeriodSeconds": 75,
        "startupFailureThreshold": 60,          # x 10 s: how long a load may take
        "shmSize": "1Gi",
        "fetchModel": False,                    # an init container fetches the default model into the volume
        "modelVolume": {"persistentVolumeClaim": {"claimName": "llmserve-models", "readOnly": True}},
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
        "nodeSelector": {},
        "tolerations": [],
        "env": [],
    },
    "metrics": {"serviceMonitor": False},
    "keda": {"enabled": False, "prometheus": "http://prometheus-operated.monitoring:9090", "minGroups": 1,
             "maxGroups": 4, "waitingPerGroup": 8},
    "inferencePool": {"enabled": False, "endpointPicker": "llmserve-epp"},
}


def profile(**changes):
    v = copy.deepcopy(BASE)
    for path, x in changes.items():
        d = v
        keys = path.split("__")
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = x
    w = v["worker"]
    assert w["tensorParallelSize"] == w["nodes"] * w["ranksPerNode"], "tensorParallelSize = nodes x ranksPerNode"
    return v


def gpu(n, mem, cpu):
    return {"requests": {"cpu": cpu, "memory": mem, "nvidia.com/gpu": n},
            "limits": {"cpu": cpu, "memory": mem, "nvidia.com/gpu": n}}


GPU_NODE = {"nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
NCCL_ENV = [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]
PVC = lambda name: {"persistentVolumeClaim": {"claimName": name, "readOnly": True}}



def gpu_profile(model, claim, nodes, per_node, mem, cpu, kv_dtype, max_len, **more):
    """A CUDA worker group of nodes x per_node GPUs serving /models/MODEL.gguf from the PVC claim, on GPU
    nodes, with the ServiceMonitor and the KEDA trigger on."""
    kw = dict(worker__image="localhost/llmserve:cuda", worker__device="cuda", worker__model="/models/%s.gguf" % model,
              worker__servedModelName=model, worker__nodes=nodes, worker__ranksPerNode=per_node,
              worker__tensorParallelSize=nodes * per_node, worker__kvCacheDtype=kv_dtype, worker__maxModelLen=max_len,
              worker__maxNumSeqs=256, worker__resources=gpu(per_node, mem, cpu), worker__modelVolume=PVC(claim),
              worker__startupFailureThreshold=180, worker__nodeSelector=GPU_NODE["nodeSelector"],
              worker__tolerations=GPU_NODE["tolerations"], worker__env=NCCL_ENV, metrics__serviceMonitor=True,
              keda__enabled=True)
    kw.update(more)
    return profile(**kw)


PROFILES = {
    # a laptop cluster (kind, minikube, k3d): the default model fetched at start, one CPU group
    "cpu-small": profile(worker__fetchModel=True, worker__modelVolume={"emptyDir": {"sizeLimit": "1Gi"}},
                         gateway__replicas=1, gateway__autoscaling={**BASE["gateway"]["autoscaling"],
                                                                    "minReplicas": 1, "maxReplicas": 3}),
    # an 8B model on one GPU (NOTES has the memory arithmetic)
    "gpu-8b": gpu_profile("llama-3-8b-instruct", "llmserve-models-8b", 1, 1, "64Gi", "8", "auto", 8192,
                          worker__startupFailureThreshold=90),
    # 70B on 4 GPUs, FP8 weights and KV
    "gpu-70b-tp4-fp8": gpu_profile("llama-3-70b-instruct", "llmserve-models-70b", 1, 4, "320Gi", "32", "fp8", 8192,
                                   worker__quantization="fp8", worker__shmSize="16Gi"),
    # 70B on 8 GPUs of one node, BF16
    "gpu-70b-tp8-bf16": gpu_profile("llama-3-70b-instruct", "llmserve-models-70b", 1, 8, "640Gi", "64", "bf16", 16384,
                                    worker__shmSize="32Gi"),
    # 70B with TP=16 over two 8-GPU nodes: one LWS group of two pods, NCCL across them (the group's
    # join on the leader's port 7700, NCCL's own sockets between the pods); 8 KV heads over 16 ranks:
    # each KV head on two ranks
    "multinode-70b-tp16": gpu_profile("llama-3-70b-instruct", "llmserve-models-70b", 2, 8, "640Gi", "64", "bf16", 32768,
                                      worker__shmSize="32Gi",
                                      worker__env=NCCL_ENV + [{"name": "NCCL_IB_DISABLE", "value": "0"}]),
    # clusters without the LWS controller: one pod a group, as a StatefulSet
    "statefulset": profile(worker__lws=False),
    # Gateway API Inference Extension (llm-d): no gateway tier; each worker pod has a gateway sidecar and
    # the pool's endpoint picker reads its vllm: gauges
    "inference-pool": profile(gateway__enabled=False, gateway__autoscaling={**BASE["gateway"]["autoscaling"], "enabled": False},
                              inferencePool__enabled=True),
}


# What `llmserve plan` says of each GPU profile (H200: 141 GiB, --gpu-memory-utilization 0.9); written
# at the top of its values file. Rerun the command after changing a profile.
NOTES = {
    "gpu-8b": """llmserve plan --model llama-3-8b --gpu-memory 141 --gpu-memory-utilization 0.9 --max-model-len 8192 --dtype bf16
  weights per GPU 14.96 GiB; activations 0.78 GiB (2048 batched tokens, 256 sequences)
  KV 131072 bytes a token (2 x 32 layers x 8 kv heads x 128 x 2 bytes), all on the one GPU
  KV pool 111.16 GiB = 910,654 tokens: 111 full 8192-token sequences at once""",
    "gpu-70b-tp4-fp8": """llmserve plan --model llama-3-70b --gpu-memory 141 --gpu-memory-utilization 0.9 --tensor-parallel-size 4 --quantization fp8 \\
    --kv-cache-dtype fp8 --max-model-len 8192
  weights per GPU 16.43 GiB (70.55B parameters in FP8 over 4); activations 0.50 GiB
  KV 163840 bytes a token (2 x 80 layers x 8 kv heads x 128 x 1 byte), 40960 per GPU
  KV pool per GPU 109.98 GiB = 2,882,944 tokens: 351 full 8192-token sequences at once""",
    "gpu-70b-tp8-bf16": """llmserve plan --model llama-3-70b --gpu-memory 141 --gpu-memory-utilization 0.9 --tensor-parallel-size 8 --dtype bf16 \\
    --max-model-len 16384
  weights per GPU 16.43 GiB (BF16 over 8); activations 0.50 GiB
  KV 327680 bytes a token (2 x 80 layers x 8 kv heads x 128 x 2 bytes), 40960 per GPU
  KV pool per GPU 109.98 GiB = 2,882,944 tokens: 175 full 16384-token sequences at once""",
    "multinode-70b-tp16": """llmserve plan --model llama-3-70b --gpu-memory 141 --gpu-memory-utilization 0.9 --tensor-parallel-size 16 --dtype bf16 \\
    --max-model-len 32768
  weights per GPU 8.21 GiB (BF16 over 16); activations 0.50 GiB
  KV 327680 bytes a token; 8 KV heads over 16 ranks: one head (40960 bytes a token) on each GPU
  KV pool per GPU 118.19 GiB = 3,098,257 tokens: 94 full 32768-token sequences at once""",
}


# ---- the template language: values, optional items -----------------------
class V:
    """A value from the values tree; yaml=True: a whole subtree (toYaml)."""

    def __init__(self, path, blob=False, as_str=False):
        self.path, self.blob, self.as_str = path, blob, as_str


def S(path):
    """A value as a string (container args are strings)."""
    return V(path, as_str=True)


class Opt:
    """List items, or the entries of a dict, present when a value is true
    (not=True: when it is false)."""

    def __init__(self, path, items, neg=False):
        self.path, self.items, self.neg = path, items, neg


MERGE = "<<"  # a dict key whose value (a V blob) is merged into the dict


def lookup(values, path):
    d = values
    for k in path.split("."):
        d = d[k]
    return d


def concrete(x, values):
    """The object for these values."""
    if isinstance(x, V):
        v = copy.deepcopy(lookup(values, x.path))
        return str(v) if x.as_str else v
    if isinstance(x, list):
        out = []
        for it in x:
            if isinstance(it, Opt):
                if bool(lookup(values, it.path)) != it.neg:
                    out.extend(concrete(it.items, values))
            else:
                out.append(concrete(it, values))
        return out
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if k == MERGE:
                out.update(concrete(v, values))
            elif isinstance(v, Opt):
                if bool(lookup(values, v.path)) != v.neg:
                    out[k] = concrete(v.items, values)
            else:
                out[k] = concrete(v, values)
        return out
    return x


def scalar(x):
    return json.dumps(x) if isinstance(x, str) else yaml.safe_dump(x, default_flow_style=True).strip().replace("\n...", "")


def helm(x, ind=0):
    """Helm template text for x, as a YAML block at indent ind."""
    pad = " " * ind
    out = []
    if isinstance(x, dict):
        for k, v in x.items():
            key = json.dumps(k) if any(c in k for c in ":/.") else k
            if k == MERGE:
                out.append("%s{{- toYaml .Values.%s | nindent %d }}" % (pad, v.path, ind))
            elif isinstance(v, Opt):
                out.append("%s{{- if %s.Values.%s }}" % (pad, "not " if v.neg else "", v.path))
                out.append("%s%s:" % (pad, key) + block(v.items, ind))
                out.append("%s{{- end }}" % pad)
            else:
                out.append("%s%s:" % (pad, key) + block(v, ind))
        return "\n".join(out)
    if isinstance(x, list):
        for it in x:
            if isinstance(it, Opt):
                out.append("%s{{- if %s.Values.%s }}" % (pad, "not " if it.neg else "", it.path))
                out.append(helm(it.items, ind))
                out.append("%s{{- end }}" % pad)
            elif isinstance(it, (dict, list)) and it:
                inner = helm(it, ind + 2)
                out.append(pad + "- " + inner.lstrip(" ") if not inner.lstrip().startswith("{{-") else pad + "-\n" + inner)
            else:
                out.append(pad + "- " + leaf(it))
        return "\n".join(out)
    return pad + leaf(x)


def leaf(x):
    if isinstance(x, V):
        return "{{ .Values.%s | %stoJson }}" % (x.path, "toString | " if x.as_str else "")
    if isinstance(x, (dict, list)):
        return "{}" if isinstance(x, dict) else "[]"
    return scalar(x)


def block(v, ind):
    """What follows "key:" for v."""
    if isinstance(v, V) and v.blob:
        return "\n%s{{- toYaml .Values.%s | nindent %d }}" % (" " * ind, v.path, ind + 2)
    if isinstance(v, (dict, list)) and v:
        return "\n" + helm(v, ind + 2 if isinstance(v, dict) else ind)
    return " " + leaf(v)


# ---- the objects ------------------------------------------------------------
def labels(component):
    return {"app.kubernetes.io/name": "llmserve", "app.kubernetes.io/component": component}


SECURE_POD = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
              "seccompProfile": {"type": "RuntimeDefault"}}
SECURE_CTR = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def probe(path, port, period, failures, initial=0):
    p = {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures,
         "timeoutSeconds": 2}
    if initial:
        p["initialDelaySeconds"] = initial
    return p


def gateway_container(workers, name="gateway"):
    return {
        "name": name,
        "image": V("gateway.image"),
        "imagePullPolicy": V("worker.imagePullPolicy"),
        "command": ["llmserve-gateway"],
        "args": ["--host", "0.0.0.0", "--port", str(HTTP)] + workers + [
            "--max-queue", S("gateway.maxQueue"), "--request-timeout", S("gateway.requestTimeout"),
            "--shutdown-timeout", S("gateway.shutdownTimeout"),
            Opt("gateway.apiKeysSecret", ["--api-keys-file", "/etc/llmserve/keys/keys"])],
        "ports": [{"name": "http", "containerPort": HTTP}],
        "readinessProbe": probe("/ready", "http", 5, 2),
        "livenessProbe": probe("/live", "http", 10, 3),
        # the load balancer takes the pod out before the drain starts
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "resources": V("gateway.resources", blob=True),
        "securityContext": SECURE_CTR,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         Opt("gateway.apiKeysSecret", [{"name": "api-keys", "mountPath": "/etc/llmserve/keys",
                                                        "readOnly": True}])],
    }


def worker_args(leader):
    node = ["--node-index", "0", "--group-address", "tcp://0.0.0.0:%d" % GROUP] if leader else \
        ["--node-index", "$(LWS_WORKER_INDEX)", "--group-address", "tcp://$(LWS_LEADER_ADDRESS):%d" % GROUP]
    return ["--model", S("worker.model"), "--served-model-name", S("worker.servedModelName"),
            "--listen", "tcp://0.0.0.0:%d" % RPC, "--health-port", str(PROBE), "--device", S("worker.device"),
            "--tensor-parallel-size", S("worker.tensorParallelSize"), "--ranks-per-node", S("worker.ranksPerNode")] + \
        node + ["--max-model-len", S("worker.maxModelLen"), "--max-num-seqs", S("worker.maxNumSeqs"),
                "--kv-cache-memory", S("worker.kvCacheMemory"), "--gpu-memory-utilization",
                S("worker.gpuMemoryUtilization"), "--kv-cache-dtype", S("worker.kvCacheDtype"),
                Opt("worker.quantization", ["--quantization", S("worker.quantization")]),
                "--shutdown-timeout", S("worker.shutdownTimeout")]


def worker_pod(leader, sidecar=False):
    ctr = {
        "name": "worker",
        "image": V("worker.image"),
        "imagePullPolicy": V("worker.imagePullPolicy"),
        "command": ["llmserve-worker"],
        "args": worker_args(leader),
        "ports": ([{"name": "rpc", "containerPort": RPC}, {"name": "group", "containerPort": GROUP}] if leader else []) +
        [{"name": "probe", "containerPort": PROBE}],
        "env": V("worker.env", blob=True),
        "startupProbe": probe("/live", "probe", 10, V("worker.startupFailureThreshold")),
        "livenessProbe": probe("/live", "probe", 10, 3),
        "resources": V("worker.resources", blob=True),
        "securityContext": SECURE_CTR,
        "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    if leader:
        ctr["readinessProbe"] = probe("/ready", "probe", 5, 2)
    containers = [ctr]
    if leader:
        containers.append(Opt("inferencePool.enabled", [gateway_container(
            ["--workers", "tcp://127.0.0.1:%d" % RPC], name="gateway")]))
    fetch = {"name": "fetch-model", "image": V("worker.image"), "imagePullPolicy": V("worker.imagePullPolicy"),
             "command": ["llmserve-fetch-model", "/models"], "securityContext": SECURE_CTR,
             "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"}]}
    lab = dict(labels("worker"))
    if leader:
        lab["llmserve.io/role"] = "leader"
    return {
        "metadata": {"labels": lab},
        "spec": {
            "terminationGracePeriodSeconds": V("worker.terminationGracePeriodSeconds"),
            "securityContext": SECURE_POD,
            "initContainers": Opt("worker.fetchModel", [fetch]),
            "containers": containers,
            "nodeSelector": V("worker.nodeSelector", blob=True),
            "tolerations": V("worker.tolerations", blob=True),
            "volumes": [{"name": "models", MERGE: V("worker.modelVolume", blob=True)},
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": V("worker.shmSize")}},
                        {"name": "tmp", "emptyDir": {}}],
        },
    }


def objects():
    """(condition, object) pairs; condition: a value path, "!path" for its negation, or None."""
    gw_sel = labels("gateway")
    out = []
    out.append(("gateway.enabled", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llmserve-gateway", "labels": gw_sel},
        "spec": {
            "replicas": V("gateway.replicas"),
            "selector": {"matchLabels": gw_sel},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": gw_sel},
                "spec": {
                    "terminationGracePeriodSeconds": V("gateway.terminationGracePeriodSeconds"),
                    "securityContext": SECURE_POD,
                    "containers": [gateway_container(["--workers-dns", "llmserve-worker-rpc:%d" % RPC])],
                    "volumes": [{"name": "tmp", "emptyDir": {}},
                                Opt("gateway.apiKeysSecret", [{"name": "api-keys", "secret": {
                                    "secretName": V("gateway.apiKeysSecret")}}])],
                },
            },
        },
    }))
    out.append(("gateway.enabled", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "llmserve", "labels": gw_sel},
        "spec": {"type": V("gateway.serviceType"), "selector": gw_sel,
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}))
    out.append(("gateway.autoscaling.enabled", {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "llmserve-gateway", "labels": gw_sel},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llmserve-gateway"},
            "minReplicas": V("gateway.autoscaling.minReplicas"), "maxReplicas": V("gateway.autoscaling.maxReplicas"),
            "metrics": [
                {"type": "Resource", "resource": {"name": "cpu", "target": {
                    "type": "Utilization", "averageUtilization": V("gateway.autoscaling.targetCPUUtilization")}}},
                # served by the Prometheus adapter (deploy/k8s/extras/prometheus-adapter-rules.yaml)
                {"type": "Pods", "pods": {"metric": {"name": "llmserve_open_streams"}, "target": {
                    "type": "AverageValue", "averageValue": V("gateway.autoscaling.targetOpenStreams")}}}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        }}))
    out.append(("gateway.enabled", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "llmserve-gateway"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": gw_sel}}}))
    lead_sel = dict(labels("worker"), **{"llmserve.io/role": "leader"})
    out.append((None, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "llmserve-worker-rpc", "labels": labels("worker")},
        # headless: the gateways' --workers-dns resolves one address per group's leader
        "spec": {"clusterIP": "None", "selector": lead_sel,
                 "ports": [{"name": "rpc", "port": RPC, "targetPort": "rpc"}]}}))
    out.append(("worker.lws", {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "llmserve-worker", "labels": labels("worker")},
        "spec": {
            "replicas": V("worker.groups"),
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": V("worker.nodes"),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": worker_pod(True),
                "workerTemplate": worker_pod(False),
            },
        }}))
    out.append(("!worker.lws", {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "llmserve-worker", "labels": labels("worker")},
        "spec": {"replicas": V("worker.groups"), "serviceName": "llmserve-worker-rpc", "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": lead_sel}, "template": worker_pod(True)}}))
    out.append((None, {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "llmserve-worker"},
        # the RPC and the group's join stay inside the namespace: gateways (and sidecars) and the group's own pods
        "spec": {"podSelector": {"matchLabels": labels("worker")}, "policyTypes": ["Ingress"],
                 "ingress": [
                     {"from": [{"podSelector": {"matchLabels": gw_sel}}, {"podSelector": {"matchLabels": labels("worker")}}],
                      "ports": [{"port": RPC}, {"port": GROUP}]},
                     {"from": [{"podSelector": {"matchLabels": labels("worker")}}]},   # NCCL's sockets between pods
                     {"ports": [{"port": PROBE}, {"port": HTTP}]}]}}))
    out.append(("metrics.serviceMonitor", {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "llmserve"},
        "spec": {"selector": {"matchLabels": gw_sel}, "endpoints": [{"port": "http", "path": "/metrics",
                                                                     "interval": "15s"}]}}))
    out.append(("keda.enabled", {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "llmserve-worker"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                               "name": "llmserve-worker"},
            "minReplicaCount": V("keda.minGroups"), "maxReplicaCount": V("keda.maxGroups"),
            "cooldownPeriod": 600,
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": V("keda.prometheus"),
                "query": "sum(vllm:num_requests_waiting)",
                "threshold": V("keda.waitingPerGroup")}}]}}))
    out.append(("inferencePool.enabled", {
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "llmserve"},
        "spec": {"selector": {"matchLabels": lead_sel}, "targetPorts": [{"number": HTTP}],
                 "endpointPickerRef": {"name": V("inferencePool.endpointPicker"), "port": {"number": 9002}}}}))
    return out


def want(cond, values):
    if cond is None:
        return True
    neg = cond.startswith("!")
    return bool(lookup(values, cond.lstrip("!"))) != neg


def render(values):
    """The objects for these values, in order."""
    objs = [concrete(o, values) for c, o in objects() if want(c, values)]
    for o in objs:  # KEDA's trigger metadata is strings
        if o["kind"] == "ScaledObject":
            for t in o["spec"]["triggers"]:
                t["metadata"] = {k: str(v) for k, v in t["metadata"].items()}
    return objs


def key(o):
    return "%s-%s" % (o["kind"].lower(), o["metadata"]["name"])


def json_patch(a, b, path=""):
    """RFC 6902 operations that turn a into b (lists that differ in length are replaced whole)."""
    if type(a) is not type(b) or not isinstance(a, (dict, list)):
        return [] if a == b else [{"op": "replace", "path": path, "value": b}]
    ops = []
    if isinstance(a, dict):
        for k in a:
            p = path + "/" + k.replace("~", "~0").replace("/", "~1")
            ops += [{"op": "remove", "path": p}] if k not in b else json_patch(a[k], b[k], p)
        for k in b:
            if k not in a:
                ops.append({"op": "add", "path": path + "/" + k.replace("~", "~0").replace("/", "~1"), "value": b[k]})
        return ops
    if len(a) != len(b):
        return [] if a == b else [{"op": "replace", "path": path, "value": b}]
    for i, (x, y) in enumerate(zip(a, b)):
        ops += json_patch(x, y, "%s/%d" % (path, i))
    return ops


def dump(objs):
    return "---\n".join(yaml.safe_dump(o, sort_keys=False, width=120) for o in objs)


HEADER = "# Generated by deploy/gen.py from one source with the Helm chart: edit that, then run it.\n"


def files():
    """Every generated file: path -> text."""
    out = {}
    base = render(BASE)
    for o in base:
        out["k8s/base/%s.yaml" % key(o)] = HEADER + dump([o])
    out["k8s/base/kustomization.yaml"] = HEADER + yaml.safe_dump(
        {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
         "resources": ["%s.yaml" % key(o) for o in base]}, sort_keys=False)
    bmap = {key(o): o for o in base}
    for name, values in PROFILES.items():
        objs = render(values)
        pmap = {key(o): o for o in objs}
        k = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": ["../../base"]}
        patches = []
        for kk, o in pmap.items():
            if kk not in bmap:
                out["k8s/overlays/%s/%s.yaml" % (name, kk)] = HEADER + dump([o])
                k["resources"].append("%s.yaml" % kk)
            else:
                ops = json_patch(bmap[kk], o)
                if ops:
                    out["k8s/overlays/%s/patch-%s.yaml" % (name, kk)] = HEADER + yaml.safe_dump(ops, sort_keys=False,
                                                                                                 width=120)
                    patches.append({"path": "patch-%s.yaml" % kk, "target": {
                        "group": o["apiVersion"].split("/")[0] if "/" in o["apiVersion"] else "",
                        "version": o["apiVersion"].split("/")[-1], "kind": o["kind"], "name": o["metadata"]["name"]}})
        for kk, o in bmap.items():
            if kk not in pmap:
                out["k8s/overlays/%s/delete-%s.yaml" % (name, kk)] = HEADER + yaml.safe_dump(
                    {"$patch": "delete", "apiVersion": o["apiVersion"], "kind": o["kind"],
                     "metadata": {"name": o["metadata"]["name"]}}, sort_keys=False)
                patches.append({"path": "delete-%s.yaml" % kk})
        if patches:
            k["patches"] = patches
        out["k8s/overlays/%s/kustomization.yaml" % name] = HEADER + yaml.safe_dump(k, sort_keys=False)
    # the chart
    out["helm/llmserve/Chart.yaml"] = HEADER + yaml.safe_dump(
        {"apiVersion": "v2", "name": "llmserve", "description": "llmserve: an OpenAI-compatible LLM serving cluster "
         "(gateways + tensor-parallel worker groups)", "type": "application", "version": "0.1.0",
         "appVersion": "0.1.0"}, sort_keys=False)
    out["helm/llmserve/values.yaml"] = HEADER + yaml.safe_dump(BASE, sort_keys=False, width=120)
    for name, values in PROFILES.items():
        note = "".join("# " + ln + "\n" for ln in NOTES[name].split("\n")) if name in NOTES else ""
        out["helm/llmserve/values-%s.yaml" % name] = HEADER + note + yaml.safe_dump(values, sort_keys=False, width=120)
    for cond, o in objects():
        text = helm(o)
        if cond:
            neg = cond.startswith("!")
            text = "{{- if %s.Values.%s }}\n%s\n{{- end }}" % ("not " if neg else "", cond.lstrip("!"), text)
        out["helm/llmserve/templates/%s.yaml" % key(concrete(o, BASE) if "name" in o["metadata"] else o)] = \
            HEADER.replace("# ", "{{/* ", 1).rstrip("\n") + " */}}\n" + text + "\n"
    return out


def main():
    check = "--check" in sys.argv
    stale = []
    want_files = files()
    for rel, text in want_files.items():
        p = os.path.join(HERE, rel)
        old = open(p).read() if os.path.exists(p) else None
        if old != text:
            stale.append(rel)
            if not check:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as f:
                    f.write(text)
    for top in ("k8s/base", "k8s/overlays", "helm/llmserve"):  # files no longer generated
        for dp, _, fns in os.walk(os.path.join(HERE, top)):
            for fn in fns:
                rel = os.path.relpath(os.path.join(dp, fn), HERE)
                if rel not in want_files:
                    stale.append(rel)
                    if not check:
                        os.remove(os.path.join(dp, fn))
    if check and stale:
        print("deploy/gen.py --check: out of date: %s (run python3 deploy/gen.py)" % ", ".join(sorted(stale)[:8]))
        return 1
    print("deploy/gen.py: %d files, %s" % (len(want_files), "%d rewritten" % len(stale) if not check else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
