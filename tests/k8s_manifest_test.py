#!/usr/bin/python3
"""Renders docker/k8s with `kubectl kustomize` (base and each overlay) and checks what the
manifests mean: names, ports consistent between the ConfigMap (cluster.env), Services,
containers, probes and scrape annotations; volumes and mounts; priorities; graceful
termination; and that each container's command line is accepted by the binary's own flag
parser (ps-server / ps-master --check_flags with the args as Kubernetes expands them);
and the credentials' roles: where tokens are configured, the master and the pods hold the
worker and the admin token from two Secrets, and workers only the worker token (never the
admin token's Secret, nor the servers' private key).

Usage: k8s_manifest_test.py BUILD_DIR   (exit 77 = skipped: kubectl or PyYAML missing)
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K8S = os.path.join(ROOT, "docker", "k8s")
SKIP = 77

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML (python3-yaml) is not installed")
    sys.exit(SKIP)

failures = []
passed = []


def check(cond, what):
    if cond:
        passed.append(what)
    else:
        failures.append(what)
        print("FAIL:", what)


def render(path):
    out = subprocess.run(["kubectl", "kustomize", path], check=True, capture_output=True,
                         text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def read_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                k, v = line.split("=", 1)
                env[k] = v
    return env


def expand(arg, env):
    """Kubernetes' $(VAR) expansion of container args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)),
                  arg)


def container_ports(c):
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def probe_port(probe, ports):
    for kind in ("grpc", "tcpSocket", "httpGet"):
        if kind in probe:
            p = probe[kind]["port"]
            return kind, ports.get(p, p) if isinstance(p, str) else p
    return None, None


def flag(args, name):
    for a in args:
        if a.startswith("--" + name + "="):
            return a.split("=", 1)[1].split()[0]
    return None


def secret_of(path, container, spec):
    """The name of the Secret a file path of `container` comes from, or None."""
    if path is None:
        return None
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        if path.startswith(m["mountPath"] + "/"):
            return vols.get(m["name"], {}).get("secret", {}).get("secretName")
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_file(path, proc, seconds=20):
    end = time.time() + seconds
    while time.time() < end and proc.poll() is None:
        if os.path.exists(path) and open(path).read().strip():
            return int(open(path).read())
        time.sleep(0.05)
    return None


def run_on_loopback(name, commands, build_dir):
    """Starts the master and pod ps-0 with the containers' expanded arguments, on loopback:
    only the host, ports, data dirs and the addresses derived from them are overridden
    (later flags win). The pod must register and become ready, and both must exit 0 on
    SIGTERM, as the kubelet would stop them."""
    tmp = tempfile.mkdtemp(prefix="k8s_manifest_test.")
    procs = []
    for mount in ("master", "ps-0"):  # the volumes' mount points
        os.makedirs(os.path.join(tmp, mount))
    try:
        def start(role, extra):
            binary, args = commands[role]
            log = open(os.path.join(tmp, role + ".log"), "w")
            p = subprocess.Popen([os.path.join(build_dir, "bin", binary)] + args + extra,
                                 stdout=log, stderr=subprocess.STDOUT)
            procs.append((role, p))
            return p
        m = start("master", ["--host=127.0.0.1", "--port=0",
                             f"--port_file={tmp}/master.port",
                             "--metrics_port=0", f"--metrics_port_file={tmp}/master.mport",
                             f"--data_dir={tmp}/master/db"])
        mport = wait_file(f"{tmp}/master.port", m)
        check(mport is not None, f"{name}: ps-master runs with its manifest's flags")
        if mport is None:
            return
        pod_port = free_port()
        p = start("ps", ["--host=127.0.0.1", f"--port={pod_port}",
                         f"--advertise_address=127.0.0.1:{pod_port}",
                         f"--master=127.0.0.1:{mport}", "--metrics_port=0",
                         f"--metrics_port_file={tmp}/ps.mport", f"--data_dir={tmp}/ps-0/db",
                         f"--checkpoint_root={tmp}/ps-0/checkpoints",
                         f"--export_root={tmp}/ps-0/exports"])
        pm = wait_file(f"{tmp}/ps.mport", p)
        ready = False
        end = time.time() + 20
        while pm is not None and time.time() < end and not ready:
            try:
                ready = urllib.request.urlopen(f"http://127.0.0.1:{pm}/healthz",
                                               timeout=2).status == 200
            except OSError:
                time.sleep(0.1)
        check(ready, f"{name}: ps-server with its manifest's flags registers and becomes ready")
        for role, proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "timeout"
            check(rc == 0, f"{name}: {role} exits 0 on SIGTERM (got {rc})")
    finally:
        for role, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if failures:
            for f in sorted(os.listdir(tmp)):
                if f.endswith(".log"):
                    print(f"---- {f}:\n" + open(os.path.join(tmp, f)).read()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)


def check_overlay(name, path, build_dir, run=False):
    print(f"== {name}: kubectl kustomize {os.path.relpath(path, ROOT)}")
    docs = render(path)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    cm = by.get(("ConfigMap", "ps-cluster"))
    check(cm is not None, f"{name}: ConfigMap ps-cluster exists")
    if cm is None:
        return
    cfg = cm["data"]
    base_env = read_env(os.path.join(K8S, "base", "cluster.env"))
    check(set(base_env) <= set(cfg), f"{name}: ConfigMap holds every key of cluster.env")

    pcs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PriorityClass"}
    check(len(pcs) == 2, f"{name}: two PriorityClasses")

    ps = by.get(("StatefulSet", cfg["PS_POD_PREFIX"]))
    master = by.get(("StatefulSet", cfg["MASTER_SERVICE"]))
    workers = by.get(("Deployment", "ps-worker"))
    check(ps is not None, f"{name}: PS StatefulSet named PS_POD_PREFIX={cfg['PS_POD_PREFIX']}")
    check(master is not None, f"{name}: master StatefulSet named MASTER_SERVICE")
    check(workers is not None, f"{name}: worker Deployment")
    if ps is None or master is None or workers is None:
        return
    namespace = ps["metadata"].get("namespace", "default")
    commands = {}
    secrets = {}  # role -> {flag: the Secret its file comes from}

    # --- PS pods
    check(ps["spec"]["replicas"] == int(cfg["NUM_PS"]),
          f"{name}: PS replicas {ps['spec']['replicas']} == NUM_PS {cfg['NUM_PS']}")
    check(master["spec"]["replicas"] == 1, f"{name}: one master")
    check(ps["spec"]["serviceName"] == cfg["PS_HEADLESS_SERVICE"],
          f"{name}: PS serviceName is the headless Service")
    headless = by.get(("Service", cfg["PS_HEADLESS_SERVICE"]))
    check(headless is not None and headless["spec"].get("clusterIP") == "None",
          f"{name}: headless Service {cfg['PS_HEADLESS_SERVICE']}")
    msvc = by.get(("Service", cfg["MASTER_SERVICE"]))
    check(msvc is not None, f"{name}: master Service {cfg['MASTER_SERVICE']}")

    for role, sts, svc, grpc_key, metrics_key, binary in (
            ("ps", ps, headless, "PS_PORT", "PS_METRICS_PORT", "ps-server"),
            ("master", master, msvc, "MASTER_PORT", "MASTER_METRICS_PORT", "ps-master")):
        tmpl = sts["spec"]["template"]
        spec = tmpl["spec"]
        c = spec["containers"][0]
        ports = container_ports(c)
        grpc_port, metrics_port = int(cfg[grpc_key]), int(cfg[metrics_key])
        check(ports.get("grpc") == grpc_port, f"{name}/{role}: containerPort grpc == {grpc_key}")
        check(ports.get("metrics") == metrics_port,
              f"{name}/{role}: containerPort metrics == {metrics_key}")
        if svc is not None:
            sports = {p["name"]: p for p in svc["spec"]["ports"]}
            check(sports.get("grpc", {}).get("port") == grpc_port,
                  f"{name}/{role}: Service port grpc == {grpc_key}")
            check(sports.get("metrics", {}).get("port") == metrics_port,
                  f"{name}/{role}: Service port metrics == {metrics_key}")
            sel = svc["spec"]["selector"]
            check(all(tmpl["metadata"]["labels"].get(k) == v for k, v in sel.items()),
                  f"{name}/{role}: Service selects the pods")
        ann = tmpl["metadata"].get("annotations", {})
        check(ann.get("prometheus.io/scrape") == "true", f"{name}/{role}: scrape annotation")
        check(ann.get("prometheus.io/port") == str(metrics_port),
              f"{name}/{role}: prometheus.io/port == {metrics_key}")
        for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = c.get(probe_name)
            check(probe is not None, f"{name}/{role}: {probe_name}")
            if probe is None:
                continue
            kind, port = probe_port(probe, ports)
            want = metrics_port if kind == "httpGet" else grpc_port
            check(port == want, f"{name}/{role}: {probe_name} ({kind}) on port {port}, want {want}")
        rp = c.get("readinessProbe", {})
        if role == "ps" and "grpc" in rp:
            check(rp["grpc"].get("service") == "ps.ParameterServer",
                  f"{name}/ps: readiness asks the health of ps.ParameterServer")
        if role == "ps" and "httpGet" in rp:
            check(rp["httpGet"]["path"] == "/healthz", f"{name}/ps: readiness on /healthz")
        # Volumes: every mount has a volume or a claim template; the data dir is on one.
        vols = {v["name"] for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
        check("data" in claims, f"{name}/{role}: volumeClaimTemplate data")
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        for m in mounts:
            check(m in vols or m in claims, f"{name}/{role}: mount {m} has a volume")
        args = c["args"]
        # The command line as Kubernetes expands it.
        env = dict(cfg)
        env.update({"POD_NAME": f"{cfg['PS_POD_PREFIX']}-0", "NAMESPACE": namespace})
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
        expanded = [expand(a, env) for a in args]
        data_dir = flag(expanded, "data_dir")
        check(data_dir is not None and data_dir.startswith(mounts.get("data", "?") + "/"),
              f"{name}/{role}: --data_dir {data_dir} is inside the data volume {mounts.get('data')}")
        for f in ("tls_cert", "tls_key", "tls_ca", "auth_token_file", "admin_token_file"):
            v = flag(expanded, f)
            if v is not None:
                check(any(v.startswith(p + "/") for p in mounts.values()),
                      f"{name}/{role}: --{f} {v} is on a mounted volume")
        if role == "ps":
            for f in ("checkpoint_root", "export_root"):
                v = flag(expanded, f)
                check(v is not None and v.startswith(mounts.get("data", "?") + "/"),
                      f"{name}/ps: --{f} {v} is on the data volume (hard-linked checkpoints)")
        secrets[role] = {f: secret_of(flag(expanded, f), c, spec)
                         for f in ("auth_token_file", "admin_token_file", "tls_key")}
        # Priority and termination.
        pc = pcs.get(spec.get("priorityClassName"))
        check(pc is not None and pc["value"] > 0, f"{name}/{role}: high PriorityClass")
        grace_key = "PS_SHUTDOWN_GRACE_MS" if role == "ps" else "MASTER_SHUTDOWN_GRACE_MS"
        check(spec.get("terminationGracePeriodSeconds", 30) * 1000 > int(cfg[grace_key]),
              f"{name}/{role}: terminationGracePeriodSeconds outlasts {grace_key}")
        check(spec.get("securityContext", {}).get("runAsNonRoot") is True,
              f"{name}/{role}: runs as non-root")
        check(any(e.get("configMapRef", {}).get("name") == "ps-cluster"
                  for e in c.get("envFrom", [])), f"{name}/{role}: env from ps-cluster")
        check(c["command"] == [binary], f"{name}/{role}: runs {binary}")
        # The binary accepts the command line as Kubernetes expands it.
        left = [a for a in expanded if "$(" in a]
        check(not left, f"{name}/{role}: every $(VAR) is defined: {left}")
        if role == "ps":
            check(flag(expanded, "pod_id") == "ps-0", f"{name}/ps: --pod_id from the pod name")
            check(flag(expanded, "advertise_address") ==
                  f"ps-0.{cfg['PS_HEADLESS_SERVICE']}.{namespace}.svc:{grpc_port}",
                  f"{name}/ps: advertises its stable DNS name")
            check(flag(expanded, "master") ==
                  f"{cfg['MASTER_SERVICE']}.{namespace}.svc:{cfg['MASTER_PORT']}",
                  f"{name}/ps: reaches the master through its Service")
            names = {e["name"]: e for e in c.get("env", [])}
            check(names.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
                  .get("fieldPath") == "metadata.name", f"{name}/ps: POD_NAME from the pod name")
        else:
            check(flag(expanded, "num_ps") == str(ps["spec"]["replicas"]),
                  f"{name}/master: --num_ps equals the PS replicas")
        commands[role] = (binary, expanded)
        bin_path = os.path.join(build_dir, "bin", binary)
        r = subprocess.run([bin_path] + expanded + ["--check_flags"], capture_output=True,
                           text=True)
        check(r.returncode == 0 and "flags ok" in r.stdout,
              f"{name}/{role}: {binary} accepts {' '.join(expanded)}: rc {r.returncode} "
              f"{r.stdout.strip()} {r.stderr.strip()[-300:]}")

    if run:
        run_on_loopback(name, commands, build_dir)

    pdb = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    check(len(pdb) == 1 and pdb[0]["spec"]["selector"]["matchLabels"].items()
          <= ps["spec"]["template"]["metadata"]["labels"].items()
          and pdb[0]["spec"].get("maxUnavailable") == 1,
          f"{name}: a PodDisruptionBudget of one PS pod")

    # --- workers: low priority, preemptible, same ConfigMap, the master's Service.
    wspec = workers["spec"]["template"]["spec"]
    wpc = pcs.get(wspec.get("priorityClassName"))
    spc = pcs.get(ps["spec"]["template"]["spec"].get("priorityClassName"))
    check(wpc is not None and spc is not None and wpc["value"] < spc["value"] and
          wpc["value"] <= 0, f"{name}: workers have a lower PriorityClass than PS pods")
    check(wpc is not None and wpc.get("preemptionPolicy") == "Never",
          f"{name}: workers preempt nothing")
    wc = wspec["containers"][0]
    wenv = dict(cfg, NAMESPACE=namespace)
    wargs = [expand(a, wenv) for a in wc["args"]]
    check(flag(wargs, "master") == f"{cfg['MASTER_SERVICE']}.{namespace}.svc:{cfg['MASTER_PORT']}",
          f"{name}: workers reach the master through its Service")
    script = wargs[0].replace("/opt/elastic-ps/python", os.path.join(ROOT, "client", "python"))
    if os.path.exists(script):
        print(f"{name}: worker script {os.path.relpath(script, ROOT)} is in the repository")
    else:
        print(f"note: {name}: worker script {os.path.relpath(script, ROOT)} is not in this tree "
              "yet (the Python examples come with the Python SDK)")
    wvols = {v["name"] for v in wspec.get("volumes", [])}
    for m in wc.get("volumeMounts", []):
        check(m["name"] in wvols, f"{name}/workers: mount {m['name']} has a volume")

    # --- roles: two credentials, and workers hold only theirs.
    for role in ("ps", "master"):
        worker, admin = secrets[role]["auth_token_file"], secrets[role]["admin_token_file"]
        if name == "production":
            check(worker and admin, f"{name}/{role}: has the worker and the admin token")
        if worker or admin:
            check(worker and admin and worker != admin,
                  f"{name}/{role}: the worker and the admin token come from two Secrets "
                  f"({worker}, {admin})")
    admin_secrets = {secrets[r]["admin_token_file"] for r in ("ps", "master")} - {None}
    server_keys = {secrets[r]["tls_key"] for r in ("ps", "master")} - {None}
    wsecrets = {v["secret"]["secretName"] for v in wspec.get("volumes", []) if "secret" in v}
    check(not (wsecrets & admin_secrets),
          f"{name}/workers: no admin token (Secrets {sorted(wsecrets)})")
    check(not (wsecrets & server_keys),
          f"{name}/workers: not the servers' private key (Secrets {sorted(wsecrets)})")
    wenv_all = {e["name"]: expand(e.get("value", ""), wenv) for e in wc.get("env", [])}
    check("PS_ADMIN_TOKEN_FILE" not in wenv_all, f"{name}/workers: no admin token file")
    if secrets["ps"]["auth_token_file"]:
        token = wenv_all.get("PS_AUTH_TOKEN_FILE")
        check(secret_of(token, wc, wspec) == secrets["ps"]["auth_token_file"],
              f"{name}/workers: PS_AUTH_TOKEN_FILE {token} is the worker token's Secret")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if shutil.which("kubectl") is None:
        print("SKIP: kubectl is not installed")
        return SKIP
    build_dir = sys.argv[1]
    check_overlay("base", os.path.join(K8S, "base"), build_dir)
    for overlay in sorted(os.listdir(os.path.join(K8S, "overlays"))):
        check_overlay(overlay, os.path.join(K8S, "overlays", overlay), build_dir,
                      run=overlay == "local")
    prod = render(os.path.join(K8S, "overlays", "production"))
    cfg = [d for d in prod if d["kind"] == "ConfigMap"][0]["data"]
    check(cfg["DURABILITY"] == "machine", "production: durability machine")
    # Replication: two copies of each vshard, on PS pods that never share a node.
    check(int(cfg.get("REPLICATION", "1")) == 2, "production: REPLICATION=2")
    pmaster = [d for d in prod if d["kind"] == "StatefulSet" and
               d["metadata"]["name"] == cfg["MASTER_SERVICE"]][0]
    margs = [expand(a, cfg) for a in pmaster["spec"]["template"]["spec"]["containers"][0]["args"]]
    check(flag(margs, "replication") == "2", f"production/master: --replication=2 ({margs})")
    check(flag(margs, "replication_ack") == "all", "production/master: --replication_ack=all")
    pps = [d for d in prod if d["kind"] == "StatefulSet" and
           d["metadata"]["name"] == cfg["PS_POD_PREFIX"]][0]
    ptmpl = pps["spec"]["template"]
    anti = (ptmpl["spec"].get("affinity", {}).get("podAntiAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", []))
    check(any(t.get("topologyKey") == "kubernetes.io/hostname" and
              t.get("labelSelector", {}).get("matchLabels", {}).items()
              <= ptmpl["metadata"]["labels"].items() for t in anti),
          "production/ps: required pod anti-affinity on the host name selects the PS pods")
    spread = ptmpl["spec"].get("topologySpreadConstraints", [])
    check(any(t.get("topologyKey") == "topology.kubernetes.io/zone" and
              t.get("labelSelector", {}).get("matchLabels", {}).items()
              <= ptmpl["metadata"]["labels"].items() for t in spread),
          "production/ps: PS pods spread over zones")
    check(int(cfg["NUM_PS"]) >= int(cfg.get("REPLICATION", "1")),
          "production: at least REPLICATION PS pods")
    base_cfg = read_env(os.path.join(K8S, "base", "cluster.env"))
    check(base_cfg.get("REPLICATION") == "1", "base: REPLICATION=1 (one copy, the default)")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"all {len(passed)} manifest checks passed, among them:")
    for what in passed:
        if "becomes ready" in what or "exits 0" in what or "accepts" in what:
            print("  " + what[:150])
    return 0


if __name__ == "__main__":
    sys.exit(main())
