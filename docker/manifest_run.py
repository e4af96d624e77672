#!/usr/bin/python3
"""Turns rendered Kubernetes manifests into `docker run` settings, so that containers run
with exactly the commands, arguments and environment Kubernetes would give them.

    kubectl kustomize docker/k8s/overlays/local | docker/manifest_run.py [--prefix P]

reads the manifests (YAML, several documents) on stdin and prints a bash fragment to
`source` (every value quoted with shlex.quote), one block per pod Kubernetes would make:
StatefulSet pods NAME-0 .. NAME-(replicas-1), Deployment pods NAME-0 ...:

    PODS=(ps-master-0 ps-0 ps-1 ps-worker-0)        # in the order of the manifests
    POD_ps_0_WORKLOAD=ps                            # the StatefulSet or Deployment
    POD_ps_0_IMAGE=elastic-ps:dev                   # image as the overlay names it
    POD_ps_0_CMD=(ps-server --host=0.0.0.0 ...)     # command + args, $(VAR) expanded
    POD_ps_0_ENV=(PS_PORT=50051 ... POD_NAME=ps-0)  # envFrom ConfigMaps, then env
    POD_ps_0_USER=10001:10001                       # securityContext runAsUser:runAsGroup
    POD_ps_0_GROUPS=(10001)                         # fsGroup
    POD_ps_0_VOLUMES=(P-ps-0-data:/var/lib/ps/data) # docker named volume:mount path[:ro]
    POD_ps_0_ALIASES=(ps-0 ps-0.ps-headless.elastic-ps.svc)  # DNS names of the pod
    POD_ps_0_READINESS=(grpc 50051 ps.ParameterServer)       # its readiness probe:
                                  # grpc PORT [SERVICE] | http PORT PATH | tcp PORT | ()

Kubernetes' rules, as the kubelet applies them: the first container of the pod template;
`$(VAR)` in command and args becomes the variable's value when the container has it
(envFrom ConfigMaps, then env in order, each env value itself expanded against the ones
before it), is left as it is otherwise, and `$$` is a literal `$`; `fieldRef`
metadata.name and metadata.namespace are the pod's name and namespace. Volumes: a
volumeClaimTemplate is one named volume per pod (P-POD-NAME), a persistentVolumeClaim one
shared named volume (P-CLAIM), an emptyDir one per pod. DNS names, as a cluster's DNS gives
them: POD (its hostname), POD.SERVICE.NS.svc for a StatefulSet pod under its (headless) serviceName, and
SERVICE.NS.svc for every pod a Service with a cluster IP selects.

Anything else a pod needs (Secret or ConfigMap volumes, other fieldRefs, resourceFieldRef,
secretKeyRef) is refused with a message naming it: such a pod cannot run the same way
under docker, and running it differently would hide that.

Exit codes: 0 printed, 1 a manifest this cannot turn into docker settings, 2 bad usage.
"""

import argparse
import re
import shlex
import sys

import yaml  # python3-yaml

WORKLOADS = ("StatefulSet", "Deployment")
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class Unsupported(Exception):
    pass


def expand(text, env):
    """Kubernetes' $(VAR) expansion of `text` against the dict `env`."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return _REF.sub(sub, str(text))


def config_maps(docs):
    return {d["metadata"]["name"]: {k: str(v) for k, v in (d.get("data") or {}).items()}
            for d in docs if d.get("kind") == "ConfigMap"}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_env(container, pod_name, namespace, cms, what):
    env = {}
    for src in container.get("envFrom") or []:
        ref = src.get("configMapRef")
        if not ref or ref.get("name") not in cms:
            raise Unsupported(f"{what}: envFrom {src} (only ConfigMaps in the manifests)")
        prefix = src.get("prefix", "")
        env.update({prefix + k: v for k, v in cms[ref["name"]].items()})
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
            continue
        field = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if field == "metadata.name":
            env[e["name"]] = pod_name
        elif field == "metadata.namespace":
            env[e["name"]] = namespace
        else:
            raise Unsupported(f"{what}: env {e['name']} from {e.get('valueFrom')}")
    return env


def volumes(spec, template, container, pod_name, prefix, what):
    kinds = {}
    for v in template["spec"].get("volumes") or []:
        if "persistentVolumeClaim" in v:
            kinds[v["name"]] = f"{prefix}-{v['persistentVolumeClaim']['claimName']}"
        elif "emptyDir" in v:
            kinds[v["name"]] = f"{prefix}-{pod_name}-{v['name']}"
        else:
            raise Unsupported(f"{what}: volume {v['name']} ({', '.join(sorted(v))})")
    for t in spec.get("volumeClaimTemplates") or []:
        name = t["metadata"]["name"]
        kinds[name] = f"{prefix}-{pod_name}-{name}"
    out = []
    for m in container.get("volumeMounts") or []:
        if m["name"] not in kinds:
            raise Unsupported(f"{what}: volumeMount {m['name']} has no volume")
        out.append(f"{kinds[m['name']]}:{m['mountPath']}" + (":ro" if m.get("readOnly") else ""))
    return out


def probe(container, what):
    """The readiness probe as (kind, port, service or path), named ports resolved."""
    p = container.get("readinessProbe")
    if not p:
        return []
    ports = {c["name"]: c["containerPort"] for c in container.get("ports") or [] if "name" in c}

    def port(v):
        if isinstance(v, int):
            return str(v)
        if v in ports:
            return str(ports[v])
        raise Unsupported(f"{what}: readinessProbe port {v!r} is not a containerPort")
    if "grpc" in p:
        return ["grpc", port(p["grpc"]["port"])] + (
            [p["grpc"]["service"]] if p["grpc"].get("service") else [])
    if "httpGet" in p:
        return ["http", port(p["httpGet"]["port"]), p["httpGet"].get("path", "/")]
    if "tcpSocket" in p:
        return ["tcp", port(p["tcpSocket"]["port"])]
    raise Unsupported(f"{what}: readinessProbe {sorted(p)}")


def pods(docs, prefix):
    cms = config_maps(docs)
    services = [d for d in docs if d.get("kind") == "Service"]
    for d in docs:
        if d.get("kind") not in WORKLOADS:
            continue
        spec, name = d["spec"], d["metadata"]["name"]
        namespace = d["metadata"].get("namespace", "default")
        template = spec["template"]
        labels = template["metadata"].get("labels") or {}
        container = template["spec"]["containers"][0]
        sc = template["spec"].get("securityContext") or {}
        for i in range(int(spec.get("replicas", 1))):
            pod_name = f"{name}-{i}"
            what = f"{d['kind']} {name} pod {pod_name}"
            env = pod_env(container, pod_name, namespace, cms, what)
            cmd = [expand(a, env) for a in (container.get("command") or []) +
                   (container.get("args") or [])]
            if not container.get("command"):
                raise Unsupported(f"{what}: no command (the image's entry point would run)")
            aliases = [pod_name]
            if d["kind"] == "StatefulSet" and spec.get("serviceName"):
                aliases.append(f"{pod_name}.{spec['serviceName']}.{namespace}.svc")
            for s in services:
                if s["spec"].get("clusterIP") != "None" and selects(
                        s["spec"].get("selector"), labels):
                    aliases.append(f"{s['metadata']['name']}.{namespace}.svc")
            user = ""
            if "runAsUser" in sc:
                user = f"{sc['runAsUser']}:{sc.get('runAsGroup', sc['runAsUser'])}"
            yield {
                "name": pod_name, "WORKLOAD": name, "IMAGE": container["image"],
                "CMD": cmd, "ENV": [f"{k}={v}" for k, v in env.items()], "USER": user,
                "GROUPS": [str(sc["fsGroup"])] if "fsGroup" in sc else [],
                "VOLUMES": volumes(spec, template, container, pod_name, prefix, what),
                "ALIASES": aliases, "READINESS": probe(container, what),
            }


def shell(pods_):
    var = lambda pod: "POD_" + re.sub(r"[^A-Za-z0-9]", "_", pod)  # noqa: E731
    lines = ["PODS=(" + " ".join(shlex.quote(p["name"]) for p in pods_) + ")"]
    for p in pods_:
        for key, value in p.items():
            if key == "name":
                continue
            if isinstance(value, list):
                lines.append(f"{var(p['name'])}_{key}=(" +
                             " ".join(shlex.quote(v) for v in value) + ")")
            else:
                lines.append(f"{var(p['name'])}_{key}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", default="elastic-ps",
                    help="prefix of the docker volume names made for claims and emptyDirs")
    args = ap.parse_args()
    try:
        docs = [d for d in yaml.safe_load_all(sys.stdin) if isinstance(d, dict)]
        out = list(pods(docs, args.prefix))
    except (yaml.YAMLError, KeyError, TypeError, ValueError, Unsupported) as e:
        print(f"manifest_run: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if not out:
        print("manifest_run: no StatefulSet or Deployment on stdin", file=sys.stderr)
        return 1
    sys.stdout.write(shell(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
