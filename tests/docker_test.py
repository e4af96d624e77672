#!/usr/bin/python3
"""Checks docker/Dockerfile against the repository, since no Docker engine runs here:
the build stage runs the same commands as the README and CI (scripts/install_deps.sh,
scripts/build.sh); every binary the image ships and every binary the Kubernetes
manifests start is an executable CMake builds; the runtime stages install no build tools
and run as a non-root user; the Python package and its generated stubs are copied.

Usage: docker_test.py   (exit 0 pass, 1 fail)
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
failures = []


def check(cond, what):
    print(("ok:   " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def stages(path):
    """[(name, [instructions])] with continuation lines joined."""
    text = open(path).read().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            out.append((m.group(2) or m.group(1), m.group(1), []))
        elif out:
            out[-1][2].append(line)
    return out


def cmake_executables():
    names = set()
    for f in glob.glob(os.path.join(ROOT, "**", "CMakeLists.txt"), recursive=True):
        if "/build" in f[len(ROOT):]:
            continue
        names.update(re.findall(r"add_executable\(\s*([\w.-]+)", open(f).read()))
    return names


def main():
    st = stages(os.path.join(ROOT, "docker", "Dockerfile"))
    names = [s[0] for s in st]
    check(names[:1] == ["build"], "the first stage is `build`")
    check(all(s[1].startswith("debian:bookworm") or s[1] in names for s in st),
          "every stage is debian:bookworm or an earlier stage")
    build = st[0][2]
    runs = [i[4:].strip() for i in build if i.upper().startswith("RUN ")]
    check(any(re.search(r"(^|\s|&&\s*)scripts/install_deps\.sh(\s|$)", r) for r in runs),
          "build stage runs scripts/install_deps.sh")
    check(any(re.search(r"(^|\s)scripts/build\.sh(\s|$)", r) for r in runs),
          "build stage runs scripts/build.sh")
    # CI and the README run the same two scripts.
    readme = open(os.path.join(ROOT, "README.md")).read()
    test_sh = open(os.path.join(ROOT, "scripts", "test.sh")).read()
    check("scripts/install_deps.sh" in test_sh and "scripts/build.sh" in test_sh,
          "scripts/test.sh (CI) runs install_deps.sh and build.sh")
    check("scripts/test.sh" in readme, "the README names scripts/test.sh")

    executables = cmake_executables()
    shipped = set()
    for name, _, instrs in st[1:]:
        for i in instrs:
            if i.upper().startswith("RUN "):
                check(not re.search(r"\b(build-essential|cmake|g\+\+|gcc|clang|[\w.+-]+-dev)\b",
                                    i), f"stage {name} installs no build tools: {i[:60]}...")
    loop = re.search(r"for b in ([\w\s-]+?);", " ".join(build))
    check(loop is not None, "the build stage names the binaries it ships")
    if loop:
        shipped = set(loop.group(1).split())
    check({"ps-server", "ps-master", "ps-admin"} <= shipped,
          f"the image ships ps-server, ps-master, ps-admin (ships {sorted(shipped)})")
    for b in sorted(shipped):
        check(b in executables, f"{b} is a CMake executable")
    final = st[-1]
    base_instrs = [i for s in st[1:] for i in s[2]]
    check(final[0] == "runtime", "the default (last) stage is `runtime`")
    users = [i for i in base_instrs if i.upper().startswith("USER ")]
    check(users and not users[-1].split()[1].startswith(("0", "root")),
          "runtime stages end as a non-root user")
    copies = " ".join(i for i in base_instrs if i.upper().startswith("COPY "))
    check("/src/client/python" in copies, "copies the Python package (client/python)")
    check("/src/build/python" in copies, "copies the generated Python stubs (build/python)")
    check("/out/bin/" in copies, "copies the binaries")

    # Every binary a manifest starts is shipped (and built by CMake).
    import yaml  # python3-yaml
    for f in glob.glob(os.path.join(ROOT, "docker", "k8s", "**", "*.yaml"), recursive=True):
        for doc in yaml.safe_load_all(open(f)):
            if not isinstance(doc, dict) or doc.get("kind") not in ("StatefulSet", "Deployment"):
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                cmd = c["command"][0]
                if cmd.startswith("/usr/bin/python3"):
                    check(True, f"{os.path.basename(f)}: {c['name']} runs the Python SDK")
                    continue
                check(cmd in shipped and cmd in executables,
                      f"{os.path.basename(f)}: {c['name']} runs {cmd}, built and shipped")
    dockerignore = open(os.path.join(ROOT, ".dockerignore")).read().split()
    check("build/" in dockerignore, ".dockerignore leaves out build/")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
