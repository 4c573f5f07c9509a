"""orchestrator.tooling.embedded: preparing the embedded server from several threads."""

from __future__ import annotations

import json
import subprocess
import sys

# Two threads read sysconfig for the first time at once, after importing the module that
# prepares the server's environment (what two TritonServer.start() calls in threads do).
CHILD = """
import json, sysconfig, threading
import orchestrator.tooling.embedded
barrier, seen = threading.Barrier(2), []
def read():
    barrier.wait()
    seen.append(sysconfig.get_config_var("LIBDIR"))
threads = [threading.Thread(target=read) for _ in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"threads": seen, "after": sysconfig.get_config_var("LIBDIR")}))
"""


def test_concurrent_first_reads_of_sysconfig_see_the_whole_cache():
    """Python 3.11 fills sysconfig's cache lazily without a lock; a thread reading during the
    fill could get LIBDIR None (most fresh processes did, before the module filled it at
    import), and the server started from it loaded the system libpython."""
    for _ in range(8):  # fresh processes: the race exists only on a first read
        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
        seen = json.loads(out.stdout)
        assert seen["after"], "this interpreter reports no LIBDIR"
        assert seen["threads"] == [seen["after"]] * 2
