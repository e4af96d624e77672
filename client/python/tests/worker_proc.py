"""A worker process for the tests: python3 worker_proc.py MASTER JOB MODE [SECONDS_PER_TASK]

MODE hold:    take one task, print "HOLDING <task_id>", keep heartbeating, never report
              (the test SIGKILLs it).
MODE sigterm: install the SIGTERM handler, then work tasks (sleeping SECONDS_PER_TASK
              each), printing "DONE <task_id>" per reported task and "LEFT" at the end.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elastic_ps import Worker  # noqa: E402


def main():
    master, job, mode = sys.argv[1:4]
    per_task = float(sys.argv[4]) if len(sys.argv) > 4 else 0.2
    w = Worker(master, job)
    print(f"WORKER {w.worker_id}", flush=True)
    if mode == "hold":
        for task in w.tasks():
            print(f"HOLDING {task.task_id}", flush=True)
            time.sleep(3600)
    elif mode == "sigterm":
        w.install_sigterm_handler()
        print("READY", flush=True)
        for task in w.tasks():
            with w.task_scope(task):
                time.sleep(per_task)
            print(f"DONE {task.task_id}", flush=True)
        print("LEFT", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
