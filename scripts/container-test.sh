#!/usr/bin/env bash
# The image, built and run by a real container engine: builds docker/Dockerfile (the pod
# image and the worker image), runs ps-master and the ps-server pods of the local overlay
# (docker/k8s/overlays/local) from it on a user network with named volumes and exactly the
# manifests' arguments, trains a small DeepFM job with a worker container, SIGKILLs a pod
# container (docker kill), starts it again on its volume, and checks that every row and
# dense tensor reads back bit for bit as before the kill.
#
#   scripts/container-test.sh [--rebuild] [--keep] [--fresh_volume] [--ctest]
#
# --rebuild       build the images even when images of this source tree exist
# --keep          leave the containers, network and volumes for a look (cleanup prints how)
# --fresh_volume  start the killed pod again on a new, empty volume instead of its own: the
#                 rows are then lost and the test must fail (a check of the check)
# --ctest         as the test run calls it: PS_CONTAINER_TEST=0 skips, =1 always runs;
#                 unset, it skips on a machine that never made the base images (a first
#                 run costs 15-30 min)
#
# Exit codes: 0 pass, 1 fail, 77 skipped (no engine can be had here: not root and no
# running engine, docker.io or mmdebstrap cannot be installed, dockerd does not start, the
# base image cannot be made, or kubectl is missing), 2 bad usage.
#
# The engine: the one running, else dockerd started here (as root; stopped at the end).
# Base images: docker/base-image.sh (mmdebstrap + docker import, cached). Images: tagged
# elastic-ps:tree-H and elastic-ps-worker:tree-H, H the git tree of the working copy
# (tracked and untracked files that git does not ignore); a run whose images exist reuses
# them, and only this tree's images keep their tags. Pods: what
# docker/manifest_run.py makes of `kubectl kustomize docker/k8s/overlays/local` (command,
# args, environment, user, volumes, DNS names, readiness probe), so the containers cannot
# drift from the manifests. The network is internal (no route out): everything stays on
# this machine. Every container, network and volume made carries the label
# org.elastic-ps.container-test=RUN and is removed at exit. Runs take a lock
# (/run/lock/elastic-ps-container-test.lock): one at a time on an engine.
# SC2155: the namerefs below are declared from pod_var, which cannot fail. SC2317: cleanup
# runs from the EXIT trap.
# shellcheck disable=SC2155,SC2317
set -euo pipefail
# One brace group, read whole before it runs: editing this file during a run cannot
# change the run.
{
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REBUILD=0 KEEP=0 FRESH_VOLUME=0 CTEST=0
for arg in "$@"; do
  case "$arg" in
    --rebuild) REBUILD=1 ;;
    --keep) KEEP=1 ;;
    --fresh_volume) FRESH_VOLUME=1 ;;
    --ctest) CTEST=1 ;;
    -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "container-test: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

DOCKER="${DOCKER:-docker}"
export DOCKER
OVERLAY="$ROOT/docker/k8s/overlays/local"
RUN="ct$$"
LABEL="org.elastic-ps.container-test=$RUN"
PREFIX="elastic-ps-$RUN"
NET="$PREFIX"
KILLED_POD=ps-0
# The small job: records of synthetic Criteo-format data in files, and a holdout file
# (eval task); train_worker.py's default of 10000 records per task makes one task a file.
RECORDS=6000 FILES=2 HOLDOUT=1000 SEED=7
PROBE_TIMEOUT_S=180 WORKER_TIMEOUT_S=600
WORK="$(mktemp -d /tmp/elastic-ps-container-test.XXXXXX)"
DOCKERD_PID=""

log() { echo "container-test: $(date +%T) $*"; }
skip() {
  echo "container-test: SKIP: $*"
  exit 77
}
fail() {
  echo "container-test: FAIL: $*" >&2
  exit 1
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" != 0 ] && [ "$rc" != 77 ] && [ -n "${ENGINE_UP:-}" ]; then
    for c in $("$DOCKER" ps -aq --filter "label=$LABEL" 2>/dev/null); do
      echo "---- last lines of $("$DOCKER" inspect -f '{{.Name}}' "$c" 2>/dev/null)" >&2
      "$DOCKER" logs --tail 15 "$c" 2>&1 | sed 's/^/  /' >&2 || true
    done
  fi
  if [ -n "${ENGINE_UP:-}" ]; then
    if [ "$KEEP" = 1 ]; then
      echo "container-test: kept; remove with: docker rm -f \$(docker ps -aq --filter label=$LABEL);" \
        "docker network rm $NET; docker volume rm \$(docker volume ls -q --filter label=$LABEL)"
    else
      local ids=()
      mapfile -t ids < <("$DOCKER" ps -aq --filter "label=$LABEL" 2>/dev/null)
      [ ${#ids[@]} = 0 ] || "$DOCKER" rm -f "${ids[@]}" >/dev/null 2>&1 || true
      "$DOCKER" network rm "$NET" >/dev/null 2>&1 || true
      mapfile -t ids < <("$DOCKER" volume ls -q --filter "label=$LABEL" 2>/dev/null)
      [ ${#ids[@]} = 0 ] || "$DOCKER" volume rm "${ids[@]}" >/dev/null 2>&1 || true
    fi
  fi
  if [ -n "$DOCKERD_PID" ]; then
    # Only the daemon this run started, by its pid: SIGTERM, then SIGKILL after 30 s.
    kill -TERM "$DOCKERD_PID" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$DOCKERD_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "container-test: FAIL: line $LINENO: $BASH_COMMAND exited $?" >&2' ERR
trap 'exit 1' INT TERM

# ---- the engine ----

# From the test run (--ctest): PS_CONTAINER_TEST=0 skips; =1 runs whatever it costs; unset
# runs only on a machine that has made the base images before (their cache exists), where
# a run costs minutes (ccache in the engine's BuildKit cache). On a machine that never did,
# the first run costs 15-30 min (base images from Debian's archive, a clean image build),
# which would more than double the test run: it is skipped, saying how to run it.
if [ "$CTEST" = 1 ]; then
  case "${PS_CONTAINER_TEST:-}" in
    0) skip "PS_CONTAINER_TEST=0" ;;
    1) ;;
    *) [ -d /var/cache/elastic-ps/base ] ||
         skip "first run on this machine (15-30 min to make the base and project images): run scripts/container-test.sh once, or set PS_CONTAINER_TEST=1" ;;
  esac
fi

command -v kubectl >/dev/null || skip "kubectl is missing (it renders the manifests)"
if ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
  skip "/usr/bin/python3 with yaml (python3-yaml) is missing"
fi
if [ "$(id -u)" = 0 ]; then
  "$ROOT/scripts/install_deps.sh" --container >"$WORK/install.log" 2>&1 ||
    skip "cannot install docker.io and mmdebstrap: $(tail -1 "$WORK/install.log")"
fi
command -v "$DOCKER" >/dev/null || skip "no docker client ($DOCKER)"

if ! "$DOCKER" version >/dev/null 2>&1 && [ "$(id -u)" != 0 ]; then
  skip "no container engine runs, and only root can start dockerd"
fi
# flock needs only a readable descriptor: any user of the engine can take the lock.
LOCK=/run/lock/elastic-ps-container-test.lock
[ -e "$LOCK" ] || touch "$LOCK" 2>/dev/null || skip "cannot make the lock file $LOCK"
exec 9<"$LOCK" || skip "cannot open the lock file $LOCK"
flock -w 1200 9 || fail "another container test held the lock for 20 minutes"

if ! "$DOCKER" version >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || skip "no container engine runs, and only root can start dockerd"
  command -v dockerd >/dev/null || skip "dockerd is missing"
  log "starting dockerd (log $WORK/dockerd.log)"
  dockerd >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 1 120); do
    "$DOCKER" version >/dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || break
    sleep 0.5
  done
  "$DOCKER" version >/dev/null 2>&1 ||
    skip "dockerd did not start: $(tail -3 "$WORK/dockerd.log" | tr '\n' ' ')"
fi
ENGINE_UP=1
log "engine: $("$DOCKER" version -f 'server {{.Server.Version}}, client {{.Client.Version}}')"

# ---- the images ----

"$ROOT/docker/base-image.sh" >"$WORK/base.log" 2>&1 ||
  skip "cannot make the base images: $(tail -2 "$WORK/base.log" | tr '\n' ' ')"

# tree_hash: the git tree of the working copy (tracked and untracked files git does not
# ignore), from a throwaway index; without git, a hash of the files themselves.
tree_hash() {
  if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    local index
    index="$(cd "$ROOT" && realpath "$(git rev-parse --git-path index)")"
    cp "$index" "$WORK/index"
    GIT_INDEX_FILE="$WORK/index" git -C "$ROOT" add -A . >/dev/null 2>&1
    GIT_INDEX_FILE="$WORK/index" git -C "$ROOT" write-tree
  else
    (cd "$ROOT" && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
      --exclude='./build*' --exclude='*.pyc' -cf - .) | sha256sum | cut -c1-40
  fi
}
TREE="$(tree_hash)"
TAG="tree-${TREE:0:16}"
IMAGE="elastic-ps:$TAG"
WORKER_IMAGE="elastic-ps-worker:$TAG"
have() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }
if [ "$REBUILD" = 0 ] && have "$IMAGE" && have "$WORKER_IMAGE"; then
  log "reusing $IMAGE and $WORKER_IMAGE (built from this source tree)"
else
  log "building $IMAGE and $WORKER_IMAGE (log $WORK/build.log; a first build takes a while)"
  start=$SECONDS
  # BuildKit (the Dockerfile's compiler cache is a BuildKit cache mount): the client's own
  # when it has buildx, else Debian's docker.io client, which has BuildKit built in.
  BUILD_CLIENT="$DOCKER"
  if ! "$DOCKER" buildx version >/dev/null 2>&1; then
    BUILD_CLIENT=/usr/bin/docker
    [ -x "$BUILD_CLIENT" ] || fail "no client can build with BuildKit (no buildx, no $BUILD_CLIENT)"
  fi
  for target in worker runtime; do
    tag="$IMAGE"
    [ "$target" = worker ] && tag="$WORKER_IMAGE"
    DOCKER_BUILDKIT=1 "$BUILD_CLIENT" build --progress=plain -f "$ROOT/docker/Dockerfile" \
      --target "$target" --label "org.elastic-ps.tree=$TREE" -t "$tag" "$ROOT" \
      >>"$WORK/build.log" 2>&1 || {
      tail -40 "$WORK/build.log" >&2
      fail "docker build --target $target failed"
    }
  done
  log "built in $((SECONDS - start)) s; compiler cache: $(grep -m1 -oE 'Hits: +[0-9]+ / +[0-9]+' \
    "$WORK/build.log" | tr -s ' ' || echo 'not run (every layer cached)')"
  if ! have "$IMAGE" || ! have "$WORKER_IMAGE"; then
    fail "docker build did not make $IMAGE and $WORKER_IMAGE"
  fi
fi
# Only this tree's images keep a tag: BuildKit's cache (layers, the compiler cache) keeps
# what another tree needs to be built again in seconds, and the engine bounds it (docker
# builder prune). (Creation times cannot order the tags: an image made from cached layers
# carries their time.)
for repo in elastic-ps elastic-ps-worker; do
  mapfile -t old_tags < <("$DOCKER" image ls "$repo" --format '{{.Repository}}:{{.Tag}}' |
    grep -E ':tree-' | grep -vx "$repo:$TAG" || true)
  for old in "${old_tags[@]}"; do "$DOCKER" rmi "$old" >/dev/null || true; done
done
log "image sizes: $("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}')" \
  "(pods), $("$DOCKER" image inspect -f '{{.Size}}' "$WORKER_IMAGE" | awk '{printf "%d MB", $1/1e6}') (workers)"

# ---- the pods, as the manifests define them ----

kubectl kustomize "$OVERLAY" >"$WORK/manifests.yaml" || fail "kubectl kustomize $OVERLAY failed"
/usr/bin/python3 "$ROOT/docker/manifest_run.py" --prefix "$PREFIX" <"$WORK/manifests.yaml" \
  >"$WORK/pods.sh" || fail "docker/manifest_run.py could not turn the manifests into pods"
# shellcheck disable=SC1091
source "$WORK/pods.sh"

# pod_var POD FIELD: the name of the variable manifest_run.py wrote for POD's FIELD.
pod_var() { echo "POD_${1//[^A-Za-z0-9]/_}_$2"; }
# image_of POD: the image built here for the image the manifest names.
image_of() {
  local v
  v="$(pod_var "$1" IMAGE)"
  case "${!v%%:*}" in
    elastic-ps) echo "$IMAGE" ;;
    elastic-ps-worker) echo "$WORKER_IMAGE" ;;
    *) fail "pod $1 runs image ${!v}, which this test does not build" ;;
  esac
}
pods_of() {  # pods_of WORKLOAD: its pods, in order
  local p v
  for p in "${PODS[@]}"; do
    v="$(pod_var "$p" WORKLOAD)"
    [ "${!v}" = "$1" ] && echo "$p"
  done
  return 0
}

"$DOCKER" network create --internal --label "$LABEL" "$NET" >/dev/null
for p in "${PODS[@]}"; do
  declare -n vols="$(pod_var "$p" VOLUMES)"
  for v in "${vols[@]}"; do
    "$DOCKER" volume inspect "${v%%:*}" >/dev/null 2>&1 ||
      "$DOCKER" volume create --label "$LABEL" "${v%%:*}" >/dev/null
  done
  unset -n vols
done

# run_pod POD: docker run of POD with the manifest's command, args, environment, user,
# volumes and DNS names (detached; the container is named PREFIX-POD).
run_pod() {
  local p="$1" a
  declare -n cmd="$(pod_var "$p" CMD)" env="$(pod_var "$p" ENV)" \
    vols="$(pod_var "$p" VOLUMES)" aliases="$(pod_var "$p" ALIASES)" \
    groups="$(pod_var "$p" GROUPS)" user="$(pod_var "$p" USER)"
  local args=(run -d --pull=never --name "$PREFIX-$p" --hostname "$p" --label "$LABEL" --network "$NET")
  for a in "${aliases[@]}"; do args+=(--network-alias "$a"); done
  for a in "${env[@]}"; do args+=(-e "$a"); done
  for a in "${vols[@]}"; do args+=(-v "$a"); done
  for a in "${groups[@]}"; do args+=(--group-add "$a"); done
  [ -z "$user" ] || args+=(--user "$user")
  args+=(--entrypoint "${cmd[0]}" "$(image_of "$p")" "${cmd[@]:1}")
  "$DOCKER" "${args[@]}" >/dev/null || fail "docker run of pod $p failed"
}

# in_net IMAGE ARGS...: a throwaway container on the pods' network (as the pods' user).
in_net() {
  local image="$1"
  shift
  "$DOCKER" run --rm -i --pull=never --label "$LABEL" --network "$NET" --user 10001:10001 \
    "$image" "$@"
}

# wait_ready POD: runs POD's readiness probe (docker/probe.py) until it passes.
wait_ready() {
  local p="$1"
  declare -n probe="$(pod_var "$p" READINESS)"
  [ ${#probe[@]} -gt 0 ] || return 0
  in_net "$WORKER_IMAGE" -c "$(cat "$ROOT/docker/probe.py")" --host "$p" \
    --timeout_s "$PROBE_TIMEOUT_S" "${probe[@]}" ||
    fail "pod $p is not ready after $PROBE_TIMEOUT_S s (probe ${probe[*]})"
}

mapfile -t MASTERS < <(pods_of ps-master)
mapfile -t PS_PODS < <(pods_of ps)
mapfile -t WORKERS < <(pods_of ps-worker)
if [ ${#MASTERS[@]} != 1 ] || [ ${#PS_PODS[@]} -lt 2 ] || [ ${#WORKERS[@]} -lt 1 ]; then
  fail "the overlay has ${#MASTERS[@]} master(s), ${#PS_PODS[@]} pods, ${#WORKERS[@]} workers"
fi
printf '%s\n' "${PS_PODS[@]}" | grep -qx "$KILLED_POD" || fail "no pod $KILLED_POD"
# The master's address as the workers' manifest gives it (--master=...).
declare -n first_worker_cmd="$(pod_var "${WORKERS[0]}" CMD)"
MASTER_ADDR="$(printf '%s\n' "${first_worker_cmd[@]}" | sed -n 's/^--master=//p' | head -1)"
MANIFEST="$(printf '%s\n' "${first_worker_cmd[@]}" | sed -n 's/^--manifest=//p' | head -1)"
if [ -z "$MASTER_ADDR" ] || [ -z "$MANIFEST" ]; then
  fail "the worker's args name no --master/--manifest"
fi
declare -n worker_vols="$(pod_var "${WORKERS[0]}" VOLUMES)"
DATA_VOLUME="" DATA_DIR=""
for v in "${worker_vols[@]}"; do
  IFS=: read -r vol path _ <<<"$v"
  case "$MANIFEST" in "$path"/*) DATA_VOLUME="$vol" DATA_DIR="$path" ;; esac
done
[ -n "$DATA_VOLUME" ] || fail "no worker volume holds $MANIFEST"

# The training data, as an operator fills the claim: synthetic Criteo-format files and
# their manifest.json, written into the data volume.
log "writing $RECORDS records in $FILES files and $HOLDOUT holdout records into $DATA_VOLUME"
"$DOCKER" run --rm --pull=never --label "$LABEL" --network none --user 0 -v "$DATA_VOLUME:$DATA_DIR" \
  --entrypoint /usr/bin/python3 "$WORKER_IMAGE" -m elastic_ps.synth --out "$DATA_DIR" \
  --records "$RECORDS" --files "$FILES" --holdout "$HOLDOUT" --seed "$SEED" \
  >"$WORK/synth.log" 2>&1 || { cat "$WORK/synth.log" >&2; fail "writing the training data failed"; }

log "starting ${MASTERS[*]} ${PS_PODS[*]}"
run_pod "${MASTERS[0]}"
wait_ready "${MASTERS[0]}"
for p in "${PS_PODS[@]}"; do run_pod "$p"; done
for p in "${PS_PODS[@]}"; do wait_ready "$p"; done
log "master and pods ready"

# ---- train ----

log "training with ${WORKERS[*]}"
for w in "${WORKERS[@]}"; do run_pod "$w"; done
for w in "${WORKERS[@]}"; do
  rc="$(timeout "$WORKER_TIMEOUT_S" "$DOCKER" wait "$PREFIX-$w")" ||
    fail "worker $w did not finish in $WORKER_TIMEOUT_S s"
  [ "$rc" = 0 ] || fail "worker $w exited $rc"
  "$DOCKER" logs "$PREFIX-$w" 2>&1 | grep -E 'job done|task .* done' | sed 's/^/  /' || true
done

# admin_status: ps-admin --json status, from a container on the network.
admin_status() { in_net "$IMAGE" ps-admin --master="$MASTER_ADDR" --json status; }
JOB="$(printf '%s\n' "${first_worker_cmd[@]}" | sed -n 's/^--job=//p' | head -1)"
admin_status >"$WORK/status.json" || fail "ps-admin status failed"
/usr/bin/python3 - "$WORK/status.json" "$JOB" "$RECORDS" <<'EOF' || fail "the job did not succeed"
import json, sys
s = json.load(open(sys.argv[1]))
g = lambda d, k: d.get(k, d.get("".join(w if i == 0 else w.title() for i, w in enumerate(k.split("_")))))
jobs = [j for j in s.get("jobs", []) if j.get("name") == sys.argv[2]]
if not jobs:
    sys.exit(f"job {sys.argv[2]} not in the master's status")
j = jobs[0]
done = int(g(j, "train_records_done") or 0)
print(f"  job {j['name']}: {j.get('state')}, {done} of {g(j, 'train_records_total')} records trained, "
      f"{g(j, 'tasks_done')} tasks done, {g(j, 'tasks_failed') or 0} failed")
sys.exit(0 if j.get("state") == "SUCCEEDED" and done == int(sys.argv[3]) else 1)
EOF

# ---- kill a pod, start it again on its volume, read the rows back ----

CHECK="$(cat "$ROOT/docker/row_check.py")"
row_check() {  # row_check MODE ARGS...: docker/row_check.py in the worker image
  local mode="$1"
  shift
  "$DOCKER" run --rm -i --pull=never --label "$LABEL" --network "$NET" --user 10001:10001 \
    -v "$DATA_VOLUME:$DATA_DIR:ro" --entrypoint /usr/bin/python3 "$WORKER_IMAGE" \
    -c "$CHECK" "$mode" --master "$MASTER_ADDR" --manifest "$MANIFEST" "$@"
}
row_check dump >"$WORK/rows.npz" || fail "reading the rows before the kill failed"
log "rows read ($(du -h "$WORK/rows.npz" | cut -f1)); SIGKILL to $KILLED_POD"
"$DOCKER" kill --signal KILL "$PREFIX-$KILLED_POD" >/dev/null
rc="$("$DOCKER" wait "$PREFIX-$KILLED_POD")"
[ "$rc" = 137 ] || fail "$KILLED_POD exited $rc after SIGKILL, not 137"
# A new container on the same volume, as a StatefulSet controller makes the pod again.
"$DOCKER" rm "$PREFIX-$KILLED_POD" >/dev/null
if [ "$FRESH_VOLUME" = 1 ]; then
  declare -n killed_vols="$(pod_var "$KILLED_POD" VOLUMES)"
  for v in "${killed_vols[@]}"; do
    "$DOCKER" volume rm "${v%%:*}" >/dev/null
    "$DOCKER" volume create --label "$LABEL" "${v%%:*}" >/dev/null
  done
  log "--fresh_volume: $KILLED_POD starts on new, empty volumes (the check must fail)"
fi
run_pod "$KILLED_POD"
wait_ready "$KILLED_POD"
log "$KILLED_POD is ready again; comparing"
row_check compare --pod "$KILLED_POD" <"$WORK/rows.npz" >"$WORK/compare.json" ||
  { cat "$WORK/compare.json" >&2; fail "rows differ after $KILLED_POD restarted"; }
cat "$WORK/compare.json"
log "PASS"
exit 0
}
