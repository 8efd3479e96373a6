#!/usr/bin/env python3
"""Whether an ext4 is frozen, seen from outside reseq: the scenarios' one reader of it.

A frozen ext4 has its journal's RECOVER flag (feature_incompat 0x4, byte 0x460 of the
device) clear; the thaw sets it again. It is read O_DIRECT from the device, never through
the filesystem (a probe through a frozen filesystem would block), from one process every
2 ms: a window of a rate-paced job lasts a fraction of a second, shorter than a dd and an
od take to start under TCG, so a loop of them misses windows.

  frozen DEV                        exit 0 if DEV is frozen now, else 1
  thawed DEV SECONDS                prints when DEV was first seen thawed; 1 after SECONDS
  freeze DEV SECONDS [STOP JOB]     prints when DEV was first seen frozen; 1 after SECONDS
  act DEV SECONDS MAIN JUDGE CMD... runs CMD in a window and follows the windows after it
                                    (CMD "cgroup-write FILE VALUE": into MAIN's cgroup)

`freeze` with STOP (a pid) SIGSTOPs it the moment the freeze is seen and returns 0 only
if DEV is still frozen 50 ms later (else continues it and polls on); 2 when JOB (a pid)
ended first. STOP may be a cgroup's directory instead: then the cgroup is frozen
(cgroup.freeze, as systemctl freeze and container pauses do) and thawed again. It prints
when the window it returns for was first seen frozen (epoch seconds): a window let go
counts for nothing, the one caught from its first sighting.

`act` waits for a window to begin on DEV (seen thawed, then frozen; 3 if reseq ends
first, thawed: a resumed job may have had one window left), runs CMD at once
(cgroup-write writes from this process: a window of the rate-paced job lasts about
0.4 s, about as long as starting a shell and a `cut` under TCG, and `systemctl
set-property` took longer than that: its OOM kill landed between windows, 3 tries of 3),
then follows every window until reseq (MAIN) is gone and DEV thawed. It prints the
window judged (frozen at, thawed at), when the action began, how many windows it saw,
and 1 if reseq was seen gone while that window was still frozen (else 0). JUDGE "last":
the last window, the one reseq died in if it died in one; "longest": the longest from
the action on. Watched from before the action: `systemctl stop` returns only after the
unit's ExecStopPost= (seconds under TCG), and timing from then counted those seconds as
frozen (6.3 s against a 3 s bound, with 2.08 s reseq's own longest freeze).
"""
import mmap
import os
import signal
import subprocess
import sys
import time

# The byte of the device that holds ext4's feature_incompat RECOVER bit (0x4).
RECOVER_BYTE, RECOVER_BIT = 0x460, 0x4
EVERY = 0.002


class Device:
    def __init__(self, dev):
        self.fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
        self.buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants

    def frozen(self):
        os.preadv(self.fd, [self.buf], 0)
        return self.buf[RECOVER_BYTE] & RECOVER_BIT == 0


def thawed(dev, secs):
    d, end = Device(dev), time.monotonic() + float(secs)
    while time.monotonic() < end:
        if not d.frozen():
            print(f"{time.time():.3f}")
            return 0
        time.sleep(EVERY)
    return 1


def freeze(dev, secs, stop=None, job=None):
    d, end = Device(dev), time.monotonic() + float(secs)

    def pause(on):
        if stop.startswith("/"):
            with open(os.path.join(stop, "cgroup.freeze"), "w") as f:
                f.write("1" if on else "0")
        else:
            os.kill(int(stop), signal.SIGSTOP if on else signal.SIGCONT)

    while time.monotonic() < end:
        if job is not None and not os.path.exists(f"/proc/{job}"):
            return 2
        if d.frozen():
            seen = time.time()
            if stop is None:
                print(f"{seen:.3f}")
                return 0
            pause(True)
            time.sleep(0.05)  # a thaw already in the kernel lands before the check
            if d.frozen():
                print(f"{seen:.3f}")
                return 0
            pause(False)
        time.sleep(EVERY)
    return 1


def cgroup_write(pid, name, value):
    """Writes VALUE to the file NAME of PID's cgroup (v2), from this process."""
    with open(f"/proc/{pid}/cgroup") as f:
        path = f.read().strip().split("::", 1)[1]
    with open(f"/sys/fs/cgroup{path}/{name}", "w") as f:
        f.write(value)


def act(dev, secs, main, judge, *cmd):
    d, secs = Device(dev), float(secs)

    def alive():
        try:
            with open(f"/proc/{main}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    end, thawed_once = time.monotonic() + secs, False
    while True:
        if time.monotonic() > end:
            return 1
        if not d.frozen():
            thawed_once = True
            if not alive():
                return 3
        elif thawed_once:
            break
        time.sleep(EVERY)
    start = time.time()
    if cmd[0] == "cgroup-write":
        try:
            cgroup_write(main, *cmd[1:])
        except OSError as e:  # reseq gone first: a failed action, not "no window"
            print(f"cgroup-write: {e}", file=sys.stderr)
            return 11
        p = None
    else:
        p = subprocess.Popen(cmd, stdout=sys.stderr)
    acted, end = time.time(), time.monotonic() + secs
    # (frozen at, thawed at, reseq seen gone while it was frozen: the guardian's to thaw)
    windows, gone_frozen = [], False
    while True:
        if time.monotonic() > end:
            return 2
        up = alive()  # before the device: gone, then still frozen, is the guardian's freeze
        f, now = d.frozen(), time.time()
        if f and start is None:
            start = now
        if f and not up:
            gone_frozen = True
        elif not f and start is not None:
            windows.append((start, now, gone_frozen))
            start, gone_frozen = None, False
        if not up and not f:
            break
        time.sleep(EVERY)
    rc = p.wait() if p else 0
    if rc:
        return 10 + rc
    w = windows[-1] if judge == "last" else max(windows, key=lambda w: w[1] - w[0])
    print(f"{w[0]:.3f} {acted:.3f} {w[1]:.3f} {len(windows)} {int(w[2])}")
    return 0


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    if what == "frozen":
        sys.exit(0 if Device(args[0]).frozen() else 1)
    sys.exit({"thawed": thawed, "freeze": freeze, "act": act}[what](*args))
