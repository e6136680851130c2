"""Why a rank ends with meshlm.distributed.teardown.end_rank (os._exit) instead of a normal interpreter exit.

One process holds both ranks of a 2-rank gloo group (two ProcessGroupGloo objects on a HashStore). Rank 1 posts an
all-reduce with a Python callback on its future; rank 0 joins it from an atexit handler, i.e. while the interpreter
shuts down. The callback then starts on a gloo thread after finalization has begun, which is what a leftover gloo
thread does when it drops a tensor that has a Python object after the last collective: with a normal exit the process
dies with "terminate called without an active exception" (SIGABRT, torch 2.13); with end_rank it exits cleanly,
because atexit handlers and finalization never run. (If a torch release stops aborting in the first case,
end_rank's reason is gone: revisit meshlm/distributed/teardown.py.)

The abort depends on the gloo thread reaching the callback after finalization began: it aborted in 10 of 10 runs on
a quiet machine but exited 0 once on a fresh-clone CI run under load, so the suite asserts only the end_rank side
(which must exit 0 without the message every time); `python tests/test_teardown.py` runs the normal-exit side and
prints what it got.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from helpers import ROOT

SCRIPT = """
import atexit, datetime, sys, threading
import torch, torch.distributed as dist
from meshlm.distributed.teardown import end_rank

store, device, groups = dist.HashStore(), dist.ProcessGroupGloo.create_device(hostname="127.0.0.1"), {}

def join(rank):
    options = dist.ProcessGroupGloo._Options()
    options._devices, options._timeout = [device], datetime.timedelta(seconds=30)
    groups[rank] = dist.ProcessGroupGloo(store, rank, 2, options)

threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
[t.start() for t in threads]
[t.join() for t in threads]
groups[1].allreduce([torch.zeros(4)]).get_future().then(lambda f: f.value())
atexit.register(lambda: groups[0].allreduce([torch.ones(4)]))
print("work done", flush=True)
if sys.argv[1] == "end_rank":
    end_rank(0)
"""


def leave_by(leave: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, leave], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "work done" in proc.stdout, proc.stderr[-2000:]
    return proc


def test_end_rank_leaves_cleanly_with_a_gloo_thread_meeting_the_exit():
    proc = leave_by("end_rank")
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, proc.stderr[-2000:]


if __name__ == "__main__":  # the failure end_rank avoids: usually SIGABRT (-6) with the message
    for _ in range(5):
        proc = leave_by("interpreter_exit")
        print(proc.returncode, signal.Signals(-proc.returncode).name if proc.returncode < 0 else "",
              "terminate called" in proc.stderr)
