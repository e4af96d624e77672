#!/usr/bin/env python3
"""Loopback TCP alone: one process writes 256 KiB messages, another reads them.

Prints the throughput, in GB/s and in 256-byte rows/s (a 64-dim float row), and the CPU
time (user + system) each side spends per row: the kernel's share of any RPC path that
moves those bytes. No third-party modules: any python3 runs it.

    benchmarks/tcp_ceiling.py [seconds]
"""
import os
import resource
import socket
import sys
import time

MSG = 256 * 1024
ROW = 256


def cpu_seconds():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the sender
        conn = socket.create_connection(("127.0.0.1", port))
        buf = bytearray(MSG)
        end = time.time() + seconds
        while time.time() < end:
            conn.sendall(buf)
        conn.close()
        os.write(report_w, repr(cpu_seconds()).encode())
        os._exit(0)
    conn, _ = listener.accept()
    view = memoryview(bytearray(MSG))
    total = 0
    start = time.time()
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        total += n
    elapsed = time.time() - start
    os.waitpid(pid, 0)
    send_cpu = float(os.read(report_r, 100))
    rows = total / ROW
    print(f"tcp loopback: {total / elapsed / 1e9:.2f} GB/s = {rows / elapsed / 1e6:.2f} M rows/s "
          f"of {ROW} B; CPU per row: sender {send_cpu / rows * 1e9:.0f} ns, "
          f"receiver {cpu_seconds() / rows * 1e9:.0f} ns")


if __name__ == "__main__":
    main()
