"""Measures the AUC gap between PS training with N asynchronous workers and the baseline.

    PS_BUILD_DIR=build PYTHONPATH=client/python:build/python /usr/bin/python3 \\
        client/python/examples/measure_gap.py --manifest DIR/manifest.json \\
        [--workers 2] [--runs 3] [--records_per_task 5000] [--baseline_seeds 0,1,2]
        [--init_seeds 0,1,2] [--no_standardize]

Per run: a fresh local cluster (ps-master and two durable pods, as in the tests), N
``train_worker.py`` processes on the job (1 epoch, the manifest's held-out file as eval
tasks), the held-out AUC from the eval tasks, and the staleness the workers saw: for each
training step, the number of other workers' steps that ended between its start (its
pulls) and its end (its pushes), from ``--step_trace``. The baseline (baseline.py) is
the mean over ``--baseline_seeds``. Prints one line per run and a summary. One job at a
time; for measurement, not a test.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402


def staleness(step_trace):
    """Per training step: other workers' steps ended between its start and its end."""
    ends = {}
    steps = []
    with open(step_trace) as f:
        for line in f:
            r = json.loads(line)
            for t0, t1 in r["steps"]:
                steps.append((r["pid"], t0, t1))
                ends.setdefault(r["pid"], []).append(t1)
    ends = {p: np.sort(np.array(v)) for p, v in ends.items()}
    out = []
    for pid, t0, t1 in steps:
        out.append(sum(int(np.searchsorted(e, t1) - np.searchsorted(e, t0, side="right"))
                       for p, e in ends.items() if p != pid))
    return np.array(out)


def baseline_auc(manifest, seeds, task_records):
    import torch

    import baseline as bl
    import deepfm

    torch.set_num_threads(1)
    with open(manifest) as f:
        m = json.load(f)
    files = [(e["path"], e["records"]) for e in m["files"]]
    prepared = bl.prepare(files, m["holdout"]["path"], deepfm.input_stats(m))
    return [bl.train_baseline(files, m["holdout"]["path"], seed=s, log=lambda x: None,
                              prepared=prepared, task_records=task_records)["auc"]
            for s in seeds]


def run_once(manifest, workers, per_task, tmp, init_seed=0):
    from conftest import Cluster

    from elastic_ps.metrics import auc
    from evaluate import from_eval_dir

    c = Cluster(tmp, lease_ms=2000)
    c.start()
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..")] +
                                            [p for p in [env.get("PYTHONPATH")] if p])
        procs = []
        for i in range(workers):
            log = open(tmp / f"w{i}.log", "ab")
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "train_worker.py"),
                 f"--master={c.master.address}", "--job=gap", f"--manifest={manifest}",
                 f"--records_per_task={per_task}", f"--eval_dir={tmp / 'eval'}",
                 f"--step_trace={tmp / 'steps.jsonl'}", f"--name=w{i}",
                 f"--init_seed={init_seed}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
            log.close()
        t0 = time.time()
        for p in procs:
            if p.wait(600) != 0:
                raise RuntimeError(f"worker exited {p.returncode}: "
                                   f"{(tmp / 'w0.log').read_text()[-2000:]}")
        seconds = time.time() - t0
    finally:
        c.stop()
    labels, probs = from_eval_dir(str(tmp / "eval"))
    return auc(labels, probs), staleness(tmp / "steps.jsonl"), seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", required=True, help="manifest.json of elastic_ps.synth")
    ap.add_argument("--workers", type=int, default=2, help="training worker processes")
    ap.add_argument("--runs", type=int, default=3, help="PS runs")
    ap.add_argument("--records_per_task", type=int, default=5000, help="task size")
    ap.add_argument("--baseline_seeds", default="0,1,2", help="baseline initial states")
    ap.add_argument("--init_seeds", default="0",
                    help="PS initializer seeds, run r uses the (r mod len)-th")
    ap.add_argument("--no_standardize", action="store_true",
                    help="the model without input standardization (mean 0, std 1 in a copy "
                    "of the manifest), as before it was added")
    args = ap.parse_args()
    if args.no_standardize:
        with open(args.manifest) as f:
            m = json.load(f)
        m["dense_mean"], m["dense_std"] = [0.0] * 13, [1.0] * 13
        args.manifest = os.path.join(tempfile.mkdtemp(prefix="gap-manifest-"), "manifest.json")
        with open(args.manifest, "w") as f:
            json.dump(m, f)
    seeds = [int(s) for s in args.baseline_seeds.split(",")]
    base = baseline_auc(args.manifest, seeds, args.records_per_task)
    b = float(np.mean(base))
    print(f"baseline AUC {b:.4f} (seeds {' '.join(f'{a:.4f}' for a in base)}, "
          f"std {np.std(base):.4f})", flush=True)
    gaps = []
    for r in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="gap-") as d:
            load = os.getloadavg()[0]
            init_seeds = [int(x) for x in args.init_seeds.split(",")]
            init_seed = init_seeds[r % len(init_seeds)]
            a, st, secs = run_once(args.manifest, args.workers, args.records_per_task,
                                   Path(d), init_seed)
        gaps.append(b - a)
        print(f"run {r}: {args.workers} workers, init seed {init_seed}, AUC {a:.4f}, gap {b - a:+.4f}, "
              f"{secs:.1f} s, load {load:.1f}; staleness mean {st.mean():.2f} "
              f"p50 {np.percentile(st, 50):.0f} p90 {np.percentile(st, 90):.0f} "
              f"p99 {np.percentile(st, 99):.0f} max {st.max()}", flush=True)
    print(f"gaps (baseline - PS): {' '.join(f'{g:+.4f}' for g in gaps)}; "
          f"max |gap| {max(abs(g) for g in gaps):.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
