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
        "maxLocalPrefillLength": 1000,         # P/D: a prompt's uncached part past this goes to a prefill group
        "requestTimeout": 600,
        "shutdownTimeout": 30,
        "terminationGracePeriodSeconds": 45,   # preStop 5 s + --shutdown-timeout 30 + 10 to spare
        "apiKeysSecret": "",                   # a Secret with a "keys" file: --api-keys-file
        "priorityClassName": "",
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
        # replicas is left to the HPA when it is on; openStreams: the second signal, which needs the
        # Prometheus adapter's rules (deploy/k8s/extras) and the ServiceMonitor, else the HPA never scales down
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 10, "targetCPUUtilization": 70,
                        "openStreams": False, "targetOpenStreams": 200},
    },
    "worker": {
        "image": "localhost/llmserve:cpu",
        "imagePullPolicy": "IfNotPresent",
        "lws": True,                            # a LeaderWorkerSet; false: a StatefulSet (one pod a group)
        "groups": 1,                            # replicas of the model (worker groups)
        "nodes": 1,                             # pods per group (LWS size)
        "ranksPerNode": 1,                      # ranks (GPUs) per pod
        "tensorParallelSize": 1,                # ranks a stage (inside a node: shared memory or NCCL)
        "pipelineParallelSize": 1,              # stages, the layers split; nodes x ranksPerNode = TP x PP
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
        "joinTimeout": 1800,                    # s: all of a group's pods scheduled, pulled, joined (--join-timeout)
        "loadTimeout": 600,                     # s: the load and warm-up, once joined (--load-timeout)
        "startupFailureThreshold": 246,         # x 10 s: the startup probe outlasts joinTimeout + loadTimeout
        "shmSize": "1Gi",
        "fetchModel": False,                    # an init container fetches the default model into the volume
        "modelClaim": "llmserve-models",        # a PVC holding the model, mounted read-only; "": an emptyDir
        "modelEmptyDirSize": "1Gi",             # the emptyDir's size when there is no claim (fetchModel fills it)
        # the claim made by the chart (create), and a Job that fills it once: url to /models/file, kept only
        # with this sha256 (tokenSecret: a Secret whose "token" key is sent as a bearer token)
        "modelStorage": {"create": False, "size": "50Gi", "storageClass": "", "accessMode": "ReadWriteMany"},
        "modelDownload": {"url": "", "sha256": "", "file": "", "tokenSecret": ""},
        "rpcSecret": "",                        # a Secret with a "secret" key: --rpc-secret-file on both tiers
        "priorityClassName": "",
        "maxSurge": 0,                          # LWS rolling update: groups made beside the old ones (needs the room)
        "pdbMaxUnavailable": 1,                 # groups a voluntary disruption may take at once
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
        "nodeSelector": {},
        "tolerations": [],
        "env": [],
        "addCapabilities": [],                  # e.g. IPC_LOCK for RDMA (NCCL over InfiniBand pins memory)
        # KV tiers under the cache (one rank, CPU): host memory (--kv-offloading-size: GiB, or 512MiB), and a
        # disk tier bounded at kvOffloadingDiskSize in an emptyDir at /kv, which outlives a worker's crash
        # (the container restarts in the same pod) but not its pod
        "kvOffloadingSize": "",
        "kvOffloadingDiskSize": "",
        # disaggregated prefill and decode: this set's role, '{"kv_role": "kv_consumer"}' (--kv-transfer-config)
        "kvTransferConfig": "",
    },
    # disaggregated prefill and decode: a second set of groups that prefill long prompts and send their KV to
    # the worker set's groups (which take kv_consumer); one pod a group (a role needs TP=1 on the CPU), with
    # the worker set's model, image and flags, behind the same headless Service: the gateways learn each
    # group's role from its health reply
    "prefill": {"enabled": False, "groups": 1, "kvTransferConfig": '{"kv_role": "kv_producer"}',
                "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}},
    # an embedding group (/v1/embeddings): a Hugging Face embedding model's folder on the models volume,
    # one CPU pod a replica, found by the gateways through the same headless Service as the groups
    "embedding": {"enabled": False, "model": "/models/all-MiniLM-L6-v2", "servedModelName": "all-MiniLM-L6-v2",
                  "replicas": 1, "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                               "limits": {"cpu": "2", "memory": "2Gi"}}},
    # serviceMonitorLabels: what the Prometheus operator's serviceMonitorSelector matches
    # (kube-prometheus-stack: release: <its release name>); alerts: a PrometheusRule
    "metrics": {"serviceMonitor": False, "serviceMonitorLabels": {"release": "prometheus"}, "alerts": False},
    # scaleDownWindow: seconds of lower demand before a group is removed (the HPA's stabilization window;
    # KEDA's cooldownPeriod applies only to scaling to zero)
    "keda": {"enabled": False, "prometheus": "http://prometheus-operated.monitoring:9090", "minGroups": 1,
             "maxGroups": 4, "waitingPerGroup": 8, "scaleDownWindow": 600},
    # a gateway sidecar in each leader pod for the Gateway API Inference Extension's InferencePool, which
    # GIE's own inferencepool chart makes (deploy/helm/gie-inferencepool-values.yaml)
    "inferencePool": {"enabled": False},
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
    assert w["tensorParallelSize"] * w["pipelineParallelSize"] == w["nodes"] * w["ranksPerNode"], \
        "tensorParallelSize x pipelineParallelSize = nodes x ranksPerNode"
    return startup_budget(v)


def gpu(n, mem, cpu):
    return {"requests": {"cpu": cpu, "memory": mem, "nvidia.com/gpu": n},
            "limits": {"cpu": cpu, "memory": mem, "nvidia.com/gpu": n}}


GPU_NODE = {"nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
NCCL_ENV = [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]



def gpu_profile(model, claim, nodes, per_node, mem, cpu, kv_dtype, max_len, **more):
    """A CUDA worker group of nodes x per_node GPUs serving /models/MODEL.gguf from the PVC claim, on GPU
    nodes, with the ServiceMonitor and the KEDA trigger on."""
    kw = dict(worker__image="localhost/llmserve:cuda", worker__device="cuda", worker__model="/models/%s.gguf" % model,
              worker__modelStorage=dict(BASE["worker"]["modelStorage"], create=True,
                                        size="50Gi" if "8b" in model else "200Gi"),
              worker__servedModelName=model, worker__nodes=nodes, worker__ranksPerNode=per_node,
              worker__tensorParallelSize=nodes * per_node, worker__kvCacheDtype=kv_dtype, worker__maxModelLen=max_len,
              worker__maxNumSeqs=256, worker__resources=gpu(per_node, mem, cpu), worker__modelClaim=claim,
              worker__loadTimeout=1800, worker__nodeSelector=GPU_NODE["nodeSelector"],
              worker__tolerations=GPU_NODE["tolerations"], worker__env=NCCL_ENV, metrics__serviceMonitor=True,
              keda__enabled=True, metrics__alerts=True)
    kw.update(more)
    return profile(**kw)


def startup_budget(v):
    """The startup probe's failures (10 s apart) that outlast the join and the load, with a minute to spare:
    the worker's own deadlines end a stalled start, not the kubelet before them."""
    w = v["worker"]
    w["startupFailureThreshold"] = -(-(w["joinTimeout"] + w["loadTimeout"]) // 10) + 6
    return v


CPU_SMALL = dict(worker__fetchModel=True, worker__modelClaim="", worker__loadTimeout=300,
                 worker__kvOffloadingSize="1", worker__kvOffloadingDiskSize="4GiB",
                 gateway__replicas=1, gateway__autoscaling={**BASE["gateway"]["autoscaling"],
                                                            "minReplicas": 1, "maxReplicas": 3})
PROFILES = {
    # a laptop cluster (kind, minikube, k3d): the default model fetched at start, one CPU group
    "cpu-small": profile(**CPU_SMALL),
    # cpu-small split in two: a prefill group (kv_producer) beside the decode group (kv_consumer); prompts
    # whose uncached part passes gateway.maxLocalPrefillLength are prefilled there and their KV sent over
    "cpu-pd": profile(**CPU_SMALL, worker__kvTransferConfig='{"kv_role": "kv_consumer"}', prefill__enabled=True),
    # cpu-small's group on two nodes as vLLM splits a model over nodes: TP inside a node, PP across them.
    # A pipeline stage a node (half the layers each), two TP ranks in each pod meeting over its shared
    # memory; the LWS group of two pods meets over TCP (the leader's port 7700 for the join, then an
    # ephemeral one for the stage hops between the pods), and the two stages' steps overlap. The KV tiers
    # run on one rank, so this profile has none
    "cpu-multinode": profile(**dict(CPU_SMALL, worker__kvOffloadingSize="", worker__kvOffloadingDiskSize=""),
                             worker__nodes=2, worker__ranksPerNode=2, worker__tensorParallelSize=2,
                             worker__pipelineParallelSize=2),
    # an 8B model on one GPU (NOTES has the memory arithmetic)
    "gpu-8b": gpu_profile("llama-3-8b-instruct", "llmserve-models-8b", 1, 1, "64Gi", "8", "auto", 8192,
                          worker__loadTimeout=900),
    # 70B on 4 GPUs, FP8 weights and KV
    "gpu-70b-tp4-fp8": gpu_profile("llama-3-70b-instruct", "llmserve-models-70b", 1, 4, "320Gi", "32", "fp8", 8192,
                                   worker__quantization="fp8", worker__shmSize="16Gi"),
    # 70B on 8 GPUs of one node, BF16
    "gpu-70b-tp8-bf16": gpu_profile("llama-3-70b-instruct", "llmserve-models-70b", 1, 8, "640Gi", "64", "bf16", 16384,
                                    worker__shmSize="32Gi"),
    # 70B over two 8-GPU nodes as vLLM runs it: TP=8 inside a node x PP=2 across them, one LWS group of
    # two pods (the group's join on the leader's port 7700). Each pod is a stage: its 8 GPUs one NCCL
    # communicator (NVLink inside the node), the stage hop a step's rows over TCP between the pods' first
    # ranks, staged through the host (NCCL send/recv between the stages is not built), instead of TP=16's
    # two all-reduces a layer across the fabric; each GPU holds one KV head of its stage's 40 layers, so
    # the cache holds twice TP=16's tokens (NOTES). The two stages' steps overlap (a virtual engine each)
    "multinode-70b-tp8-pp2": gpu_profile("llama-3-70b-instruct", "llmserve-models-70b", 2, 8, "640Gi", "64", "bf16",
                                         32768, worker__shmSize="32Gi", worker__tensorParallelSize=8,
                                         worker__pipelineParallelSize=2),
    # the CPU base with an embedding group beside the generation group (/v1/embeddings)
    "embeddings": profile(embedding__enabled=True),
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
    "multinode-70b-tp8-pp2": """llmserve plan --model llama-3-70b --gpu-memory 141 --gpu-memory-utilization 0.9 --tensor-parallel-size 8 \\
    --pipeline-parallel-size 2 --dtype bf16 --max-model-len 32768
  stage 0: layers 0..39 + embeddings on 8 GPUs, stage 1: layers 40..79 + LM head on 8 GPUs
  weights per GPU 8.21 GiB (BF16 over 16); activations 0.50 GiB
  KV 327680 bytes a token: one KV head of a stage's 40 layers (20480 bytes a token) on each GPU
  KV pool per GPU 118.19 GiB = 6,196,515 tokens: 189 full 32768-token sequences at once (TP=16: 94)""",
}


# ---- the template language: values, optional items -----------------------
class V:
    """A value from the values tree; yaml=True: a whole subtree (toYaml)."""

    def __init__(self, path, blob=False, as_str=False):
        self.path, self.blob, self.as_str = path, blob, as_str


def S(path):
    """A value as a string (container args are strings)."""
    return V(path, as_str=True)


class T:
    """A string naming the release: {release} is its name ("llmserve" in the Kustomize tree, Helm's
    .Release.Name in the chart), {namespace} its namespace ("default" / .Release.Namespace)."""

    def __init__(self, fmt):
        self.fmt = fmt

    def text(self, rel):
        return self.fmt.replace("{release}", rel["release"]).replace("{namespace}", rel["namespace"])


KUSTOMIZE_RELEASE = {"release": "llmserve", "namespace": "default"}
HELM_RELEASE = {"release": "{{ .Release.Name }}", "namespace": "{{ .Release.Namespace }}"}


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


def concrete(x, values, rel=None):
    """The object for these values (rel: the release's name and namespace)."""
    rel = rel or KUSTOMIZE_RELEASE
    if isinstance(x, T):
        return x.text(rel)
    if isinstance(x, V):
        v = copy.deepcopy(lookup(values, x.path))
        return str(v) if x.as_str else v
    if isinstance(x, list):
        out = []
        for it in x:
            if isinstance(it, Opt):
                if bool(lookup(values, it.path)) != it.neg:
                    out.extend(concrete(it.items, values, rel))
            else:
                out.append(concrete(it, values, rel))
        return out
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if k == MERGE:
                out.update(concrete(v, values, rel))
            elif isinstance(v, Opt):
                if bool(lookup(values, v.path)) != v.neg:
                    out[k] = concrete(v.items, values, rel)
            else:
                out[k] = concrete(v, values, rel)
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
                out.append("%s{{- with .Values.%s }}" % (pad, v.path))
                out.append("%s{{- toYaml . | nindent %d }}" % (pad, ind))
                out.append("%s{{- end }}" % pad)
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
    if isinstance(x, T):
        return json.dumps(x.text(HELM_RELEASE))
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
    """A component's labels: the release's instance label keeps two releases' selectors apart."""
    return {"app.kubernetes.io/name": "llmserve", "app.kubernetes.io/instance": T("{release}"),
            "app.kubernetes.io/component": component}


SECURE_POD = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
              "seccompProfile": {"type": "RuntimeDefault"}}
SECURE_CTR = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
# a Secret's files: owner read, and group read for the pod's fsGroup, which the process holds
# (--rpc-secret-file and --api-keys-file refuse a file others can read)
SECRET_MODE = 0o440


def probe(path, port, period, failures, initial=0):
    p = {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures,
         "timeoutSeconds": 2}
    if initial:
        p["initialDelaySeconds"] = initial
    return p


def secret_volume(name, value):
    return Opt(value, [{"name": name, "secret": {"secretName": V(value), "defaultMode": SECRET_MODE}}])


# the model: the claim (read-only) or, without one, an emptyDir: one source, whatever the values merge to
MODELS_VOLUME = {"name": "models",
                 "persistentVolumeClaim": Opt("worker.modelClaim", {"claimName": V("worker.modelClaim"), "readOnly": True}),
                 "emptyDir": Opt("worker.modelClaim", {"sizeLimit": V("worker.modelEmptyDirSize")}, neg=True)}
RPC_SECRET_ARGS = Opt("worker.rpcSecret", ["--rpc-secret-file", "/etc/llmserve/rpc/secret"])
RPC_SECRET_MOUNT = Opt("worker.rpcSecret", [{"name": "rpc-secret", "mountPath": "/etc/llmserve/rpc", "readOnly": True}])


def gateway_container(workers, name="gateway"):
    return {
        "name": name,
        "image": V("gateway.image"),
        "imagePullPolicy": V("worker.imagePullPolicy"),
        "command": ["llmserve-gateway"],
        "args": ["--host", "0.0.0.0", "--port", str(HTTP)] + workers + [
            "--max-queue", S("gateway.maxQueue"), "--max-local-prefill-length", S("gateway.maxLocalPrefillLength"),
            "--request-timeout", S("gateway.requestTimeout"),
            "--shutdown-timeout", S("gateway.shutdownTimeout"),
            Opt("gateway.apiKeysSecret", ["--api-keys-file", "/etc/llmserve/keys/keys"]), RPC_SECRET_ARGS],
        "ports": [{"name": "http", "containerPort": HTTP}],
        "readinessProbe": probe("/ready", "http", 5, 2),
        "livenessProbe": probe("/live", "http", 10, 3),
        # the load balancer takes the pod out before the drain starts
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "resources": V("gateway.resources", blob=True),
        "securityContext": SECURE_CTR,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         Opt("gateway.apiKeysSecret", [{"name": "api-keys", "mountPath": "/etc/llmserve/keys",
                                                        "readOnly": True}]), RPC_SECRET_MOUNT],
    }


def worker_args(leader, prefill=False):
    node = ["--node-index", "0", "--group-address", "tcp://0.0.0.0:%d" % GROUP] if leader else \
        ["--node-index", "$(LWS_WORKER_INDEX)", "--group-address", "tcp://$(LWS_LEADER_ADDRESS):%d" % GROUP]
    return ["--model", S("worker.model"), "--served-model-name", S("worker.servedModelName"),
            "--listen", "tcp://0.0.0.0:%d" % RPC, "--health-port", str(PROBE), "--device", S("worker.device"),
            "--tensor-parallel-size", S("worker.tensorParallelSize"), "--pipeline-parallel-size",
            S("worker.pipelineParallelSize"), "--ranks-per-node", S("worker.ranksPerNode")] + \
        node + ["--join-timeout", S("worker.joinTimeout"), "--load-timeout", S("worker.loadTimeout"),
                "--max-model-len", S("worker.maxModelLen"), "--max-num-seqs", S("worker.maxNumSeqs"),
                "--kv-cache-memory", S("worker.kvCacheMemory"), "--gpu-memory-utilization",
                S("worker.gpuMemoryUtilization"), "--kv-cache-dtype", S("worker.kvCacheDtype"),
                Opt("worker.quantization", ["--quantization", S("worker.quantization")]),
                Opt("worker.kvOffloadingSize", ["--kv-offloading-size", S("worker.kvOffloadingSize")]),
                Opt("worker.kvOffloadingDiskSize", ["--kv-offloading-dir", "/kv", "--kv-offloading-disk-size",
                                                    S("worker.kvOffloadingDiskSize")]),
                ] + (["--kv-transfer-config", S("prefill.kvTransferConfig")] if prefill else
                     [Opt("worker.kvTransferConfig", ["--kv-transfer-config", S("worker.kvTransferConfig")])]) + [
                "--shutdown-timeout", S("worker.shutdownTimeout"), RPC_SECRET_ARGS]


def worker_pod(leader, prefill=False):
    """A group's pod: its leader (or a follower), or a prefill group's one pod."""
    ctr = {
        "name": "worker",
        "image": V("worker.image"),
        "imagePullPolicy": V("worker.imagePullPolicy"),
        "command": ["llmserve-worker"],
        "args": worker_args(leader, prefill),
        "ports": ([{"name": "rpc", "containerPort": RPC}, {"name": "group", "containerPort": GROUP}] if leader else []) +
        [{"name": "probe", "containerPort": PROBE}],
        "env": V("worker.env", blob=True),
        # /live answers 200 while the group joins and loads, 503 past --load-timeout (and the worker exits)
        "startupProbe": probe("/live", "probe", 10, V("worker.startupFailureThreshold")),
        "livenessProbe": probe("/live", "probe", 10, 3),
        "resources": V("prefill.resources" if prefill else "worker.resources", blob=True),
        "securityContext": dict(SECURE_CTR, capabilities={
            "drop": ["ALL"], "add": Opt("worker.addCapabilities", V("worker.addCapabilities", blob=True))}),
        "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "tmp", "mountPath": "/tmp"}, RPC_SECRET_MOUNT,
                         Opt("worker.kvOffloadingDiskSize", [{"name": "kv", "mountPath": "/kv"}])],
    }
    if leader:
        ctr["readinessProbe"] = probe("/ready", "probe", 5, 2)
    containers = [ctr]
    if leader and not prefill:
        containers.append(Opt("inferencePool.enabled", [gateway_container(
            ["--workers", "tcp://127.0.0.1:%d" % RPC], name="gateway")]))
    fetch = {"name": "fetch-model", "image": V("worker.image"), "imagePullPolicy": V("worker.imagePullPolicy"),
             "command": ["llmserve-fetch-model", "/models"], "securityContext": SECURE_CTR,
             "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"}]}
    lab = dict(labels("worker"), **{"llmserve.io/task": "prefill" if prefill else "generate"})
    if leader:
        lab["llmserve.io/role"] = "leader"
    return {
        "metadata": {"labels": lab},
        "spec": {
            "terminationGracePeriodSeconds": V("worker.terminationGracePeriodSeconds"),
            "priorityClassName": Opt("worker.priorityClassName", V("worker.priorityClassName")),
            "securityContext": SECURE_POD,
            "initContainers": Opt("worker.fetchModel", [fetch]),
            "containers": containers,
            "nodeSelector": V("worker.nodeSelector", blob=True),
            "tolerations": V("worker.tolerations", blob=True),
            # groups of one model spread over nodes: one node's loss takes one replica, not all
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                           "whenUnsatisfiable": "ScheduleAnyway",
                                           "labelSelector": {"matchLabels": lab}}],
            "volumes": [MODELS_VOLUME,
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": V("worker.shmSize")}},
                        {"name": "tmp", "emptyDir": {}}, secret_volume("rpc-secret", "worker.rpcSecret"),
                        Opt("worker.kvOffloadingDiskSize", [{"name": "kv", "emptyDir": {}}])],
        },
    }


def objects():
    """(condition, object) pairs; condition: a value path, "!path" for its negation, or None."""
    gw_sel = labels("gateway")
    out = []
    out.append(("gateway.enabled", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": T("{release}-gateway"), "labels": gw_sel},
        "spec": {
            # with the HPA on, replicas is its to set: an apply must not scale the gateways back
            "replicas": Opt("gateway.autoscaling.enabled", V("gateway.replicas"), neg=True),
            "selector": {"matchLabels": gw_sel},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": gw_sel},
                "spec": {
                    "terminationGracePeriodSeconds": V("gateway.terminationGracePeriodSeconds"),
                    "priorityClassName": Opt("gateway.priorityClassName", V("gateway.priorityClassName")),
                    "securityContext": SECURE_POD,
                    "containers": [gateway_container(["--workers-dns", T("{release}-worker-rpc:%d" % RPC)])],
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                   "whenUnsatisfiable": "ScheduleAnyway",
                                                   "labelSelector": {"matchLabels": gw_sel}}],
                    "volumes": [{"name": "tmp", "emptyDir": {}}, secret_volume("api-keys", "gateway.apiKeysSecret"),
                                secret_volume("rpc-secret", "worker.rpcSecret")],
                },
            },
        },
    }))
    out.append(("gateway.enabled", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": T("{release}"), "labels": gw_sel},
        "spec": {"type": V("gateway.serviceType"), "selector": gw_sel,
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}))
    out.append(("gateway.autoscaling.enabled", {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": T("{release}-gateway"), "labels": gw_sel},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": T("{release}-gateway")},
            "minReplicas": V("gateway.autoscaling.minReplicas"), "maxReplicas": V("gateway.autoscaling.maxReplicas"),
            "metrics": [
                {"type": "Resource", "resource": {"name": "cpu", "target": {
                    "type": "Utilization", "averageUtilization": V("gateway.autoscaling.targetCPUUtilization")}}},
                # served by the Prometheus adapter (deploy/k8s/extras/prometheus-adapter-rules.yaml): without it
                # the HPA cannot read this metric and never scales down, so it is off unless asked for
                Opt("gateway.autoscaling.openStreams", [
                    {"type": "Pods", "pods": {"metric": {"name": "llmserve_open_streams"}, "target": {
                        "type": "AverageValue", "averageValue": V("gateway.autoscaling.targetOpenStreams")}}}])],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        }}))
    out.append(("gateway.enabled", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": T("{release}-gateway"),
                                                                             "labels": gw_sel},
        # one pod at a time: with one replica a drain still proceeds (minAvailable 1 of 1 would block it)
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": gw_sel}}}))
    lead_sel = dict(labels("worker"), **{"llmserve.io/role": "leader"})
    out.append((None, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": T("{release}-worker-rpc"), "labels": labels("worker")},
        # headless: the gateways' --workers-dns resolves one address per group's leader
        "spec": {"clusterIP": "None", "selector": lead_sel,
                 "ports": [{"name": "rpc", "port": RPC, "targetPort": "rpc"}]}}))
    out.append((None, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": T("{release}-worker"),
                                                                             "labels": labels("worker")},
        # a voluntary disruption (a node drain) takes at most this many groups' leaders at once
        "spec": {"maxUnavailable": V("worker.pdbMaxUnavailable"), "selector": {"matchLabels": lead_sel}}}))
    out.append(("worker.lws", {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": T("{release}-worker"), "labels": labels("worker")},
        "spec": {
            # with KEDA on, the group count is its to set
            "replicas": Opt("keda.enabled", V("worker.groups"), neg=True),
            "startupPolicy": "LeaderCreated",
            # maxSurge: a rollout makes new groups beside the old before taking any down (one-group
            # deployments keep serving); 0 where the cluster has no room for a second copy
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                "maxUnavailable": 1, "maxSurge": V("worker.maxSurge")}},
            "leaderWorkerTemplate": {
                "size": V("worker.nodes"),
                # a pod lost after the group started recreates the group; one still starting (pending,
                # pulling) does not loop it (--join-timeout bounds that wait)
                "restartPolicy": "RecreateGroupAfterStart",
                "leaderTemplate": worker_pod(True),
                "workerTemplate": worker_pod(False),
            },
        }}))
    out.append(("!worker.lws", {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": T("{release}-worker"), "labels": labels("worker")},
        "spec": {"replicas": Opt("keda.enabled", V("worker.groups"), neg=True), "serviceName": T("{release}-worker-rpc"),
                 "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": dict(lead_sel, **{"llmserve.io/task": "generate"})},
                 "template": worker_pod(True)}}))
    pre_sel = dict(lead_sel, **{"llmserve.io/task": "prefill"})
    out.append(("prefill.enabled", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": T("{release}-prefill"), "labels": labels("worker")},
        # a prefill group holds no stream: a new pod beside the old, then the old goes (meanwhile, and
        # whenever none is up, the decode groups prefill for themselves)
        "spec": {"replicas": V("prefill.groups"), "selector": {"matchLabels": pre_sel},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                 "template": worker_pod(True, prefill=True)}}))
    out.append(("worker.modelStorage.create", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": V("worker.modelClaim"), "labels": labels("models"),
                     # kept by helm uninstall: a model is hours of download
                     "annotations": {"helm.sh/resource-policy": "keep"}},
        "spec": {"accessModes": [V("worker.modelStorage.accessMode")],
                 "storageClassName": Opt("worker.modelStorage.storageClass", V("worker.modelStorage.storageClass")),
                 "resources": {"requests": {"storage": V("worker.modelStorage.size")}}}}))
    out.append(("worker.modelDownload.url", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": T("{release}-fetch-model"), "labels": labels("models")},
        "spec": {"backoffLimit": 6, "template": {
            "metadata": {"labels": labels("models")},
            "spec": {
                "restartPolicy": "OnFailure",
                "securityContext": SECURE_POD,
                "containers": [{
                    "name": "fetch", "image": V("worker.image"), "imagePullPolicy": V("worker.imagePullPolicy"),
                    "command": ["llmserve-fetch-model", "/models", "url", S("worker.modelDownload.url"),
                                S("worker.modelDownload.sha256"), S("worker.modelDownload.file")],
                    "env": Opt("worker.modelDownload.tokenSecret", [{"name": "FETCH_TOKEN", "valueFrom": {
                        "secretKeyRef": {"name": V("worker.modelDownload.tokenSecret"), "key": "token"}}}]),
                    "securityContext": SECURE_CTR,
                    "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"}]}],
                "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": V("worker.modelClaim")}},
                            {"name": "tmp", "emptyDir": {}}]}}}}))
    emb_lab = dict(labels("worker"), **{"llmserve.io/role": "leader", "llmserve.io/task": "embed"})
    out.append(("embedding.enabled", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": T("{release}-embed"), "labels": emb_lab},
        "spec": {
            "replicas": V("embedding.replicas"),
            "selector": {"matchLabels": emb_lab},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": emb_lab},
                "spec": {
                    "terminationGracePeriodSeconds": V("worker.terminationGracePeriodSeconds"),
                    "securityContext": SECURE_POD,
                    "containers": [{
                        "name": "embed", "image": V("worker.image"), "imagePullPolicy": V("worker.imagePullPolicy"),
                        "command": ["llmserve-worker"],
                        "args": ["--model", S("embedding.model"), "--served-model-name", S("embedding.servedModelName"),
                                 "--listen", "tcp://0.0.0.0:%d" % RPC, "--health-port", str(PROBE),
                                 "--load-timeout", S("worker.loadTimeout"), "--shutdown-timeout",
                                 S("worker.shutdownTimeout"), RPC_SECRET_ARGS],
                        "ports": [{"name": "rpc", "containerPort": RPC}, {"name": "probe", "containerPort": PROBE}],
                        "startupProbe": probe("/live", "probe", 10, V("worker.startupFailureThreshold")),
                        "readinessProbe": probe("/ready", "probe", 5, 2),
                        "livenessProbe": probe("/live", "probe", 10, 3),
                        "resources": V("embedding.resources", blob=True),
                        "securityContext": SECURE_CTR,
                        "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"},
                                         RPC_SECRET_MOUNT]}],
                    "volumes": [MODELS_VOLUME,
                                {"name": "tmp", "emptyDir": {}}, secret_volume("rpc-secret", "worker.rpcSecret")],
                },
            },
        }}))
    out.append((None, {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": T("{release}-worker"),
                                                                                  "labels": labels("worker")},
        # the RPC and the group's join stay inside the namespace: gateways (and sidecars) and the group's own pods
        "spec": {"podSelector": {"matchLabels": labels("worker")}, "policyTypes": ["Ingress"],
                 "ingress": [
                     {"from": [{"podSelector": {"matchLabels": gw_sel}}, {"podSelector": {"matchLabels": labels("worker")}}],
                      "ports": [{"port": RPC}, {"port": GROUP}]},
                     # NCCL's sockets between pods, and a CPU group's TCP collectives (an ephemeral port of its leader)
                     {"from": [{"podSelector": {"matchLabels": labels("worker")}}]},
                     {"ports": [{"port": PROBE}, {"port": HTTP}]}]}}))
    out.append(("metrics.serviceMonitor", {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": T("{release}"), "labels": {**gw_sel, MERGE: V("metrics.serviceMonitorLabels")}},
        # the gateways' /metrics: every group's gauges as each gateway sees them (label worker)
        "spec": {"selector": {"matchLabels": gw_sel}, "endpoints": [{"port": "http", "path": "/metrics",
                                                                     "interval": "15s"}]}}))
    out.append(("metrics.serviceMonitor", {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": {"name": T("{release}-worker"), "labels": {**labels("worker"), MERGE: V("metrics.serviceMonitorLabels")}},
        # each group's own /metrics on its leader's probe port (vLLM's names, llmserve:worker_*)
        "spec": {"selector": {"matchLabels": lead_sel}, "podMetricsEndpoints": [{"port": "probe", "path": "/metrics",
                                                                                 "interval": "15s"}]}}))
    sel = 'namespace="{namespace}",service="{release}"'
    out.append(("metrics.alerts", {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": T("{release}"), "labels": {**gw_sel, MERGE: V("metrics.serviceMonitorLabels")}},
        "spec": {"groups": [{"name": "llmserve", "rules": [
            {"alert": "LlmserveErrorRate", "for": "5m", "labels": {"severity": "warning"},
             "expr": T('sum(rate(llmserve:gateway_requests_total{%s,status="5xx"}[5m])) / '
                       'sum(rate(llmserve:gateway_requests_total{%s}[5m])) > 0.05' % (sel, sel)),
             "annotations": {"summary": "More than 5% of requests end in a server error"}},
            {"alert": "LlmserveTTFTHigh", "for": "10m", "labels": {"severity": "warning"},
             "expr": T('histogram_quantile(0.99, sum(rate(llmserve:time_to_first_token_seconds_bucket{%s}[5m])) '
                       'by (le)) > 10' % sel),
             "annotations": {"summary": "Time to first token p99 above 10 s"}},
            {"alert": "LlmserveQueueGrowing", "for": "10m", "labels": {"severity": "warning"},
             "expr": T('deriv(max(vllm:num_requests_waiting{%s})[10m:1m]) > 0 and '
                       'max(vllm:num_requests_waiting{%s}) > 16' % (sel, sel)),
             "annotations": {"summary": "Requests are queueing faster than the groups serve them"}},
            {"alert": "LlmserveKVCacheFull", "for": "10m", "labels": {"severity": "warning"},
             "expr": T('max(llmserve:kv_cache_usage_perc{%s}) by (worker) > 0.95' % sel),
             "annotations": {"summary": "A worker group's KV cache is above 95% (preemptions follow)"}},
            {"alert": "LlmserveWorkerLost", "for": "0m", "labels": {"severity": "critical"},
             "expr": T('increase(llmserve:worker_lost_total{%s}[5m]) > 0' % sel),
             "annotations": {"summary": "A worker group was lost: its requests moved or failed"}},
        ]}]}}))
    out.append(("keda.enabled", {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": T("{release}-worker"), "labels": labels("worker")},
        "spec": {
            "scaleTargetRef": {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                               "name": T("{release}-worker")},
            "minReplicaCount": V("keda.minGroups"), "maxReplicaCount": V("keda.maxGroups"),
            # scale-down from N to fewer waits for the HPA's window (cooldownPeriod is for scaling to zero only)
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {
                "stabilizationWindowSeconds": V("keda.scaleDownWindow")}}}},
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": V("keda.prometheus"),
                # every gateway reports the sum over all groups: one gateway's view (max), of this release only
                "query": T('max(vllm:num_requests_waiting{%s})' % sel),
                # KEDA's trigger metadata is map[string]string: a number is refused by the API server
                "threshold": S("keda.waitingPerGroup")}}]}}))
    return out


def want(cond, values):
    if cond is None:
        return True
    neg = cond.startswith("!")
    return bool(lookup(values, cond.lstrip("!"))) != neg


def render(values):
    """The objects for these values, in order."""
    return [concrete(o, values) for c, o in objects() if want(c, values)]


def values_diff(base, v):
    """What a values file passed with -f holds to turn base into v under Helm's merge (helm_merge):
    only what differs; a key v lacks is null (Helm deletes it)."""
    out = {}
    for k, x in v.items():
        if k not in base:
            out[k] = x
        elif isinstance(x, dict) and isinstance(base[k], dict):
            d = values_diff(base[k], x)
            if d:
                out[k] = d
        elif x != base[k]:
            out[k] = x
    for k in base:
        if k not in v:
            out[k] = None
    return out


def helm_merge(base, over):
    """Helm's coalescing of a -f file over the chart's values: maps merge key by key, anything else
    (lists too) replaces, and null deletes the key."""
    out = copy.deepcopy(base)
    for k, x in over.items():
        if x is None:
            out.pop(k, None)
        elif isinstance(x, dict) and isinstance(out.get(k), dict):
            out[k] = helm_merge(out[k], x)
        else:
            out[k] = copy.deepcopy(x)
    return out


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
        over = values_diff(BASE, values)
        assert helm_merge(BASE, over) == values, name
        out["helm/llmserve/values-%s.yaml" % name] = HEADER + note + \
            "# helm install RELEASE deploy/helm/llmserve -f values-%s.yaml: what differs from values.yaml\n" % name + \
            yaml.safe_dump(over, sort_keys=False, width=120)
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
