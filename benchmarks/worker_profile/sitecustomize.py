"""Profile each forked Ansible worker (CPU time) into $WORKER_PROFILE_DIR/<pid>.prof, by hand only:
`PYTHONPATH=benchmarks/worker_profile WORKER_PROFILE_DIR=/tmp/prof provision drift ... --full`, then add the files up
with pstats. The main process and short-lived workers are both covered (py-spy misses the latter)."""

import os
import sys

if os.environ.get("WORKER_PROFILE_DIR") and "ansible-playbook" in " ".join(sys.argv):
    import multiprocessing.process as _mp

    _orig = _mp.BaseProcess._bootstrap

    def _bootstrap(self, *a, **k):  # type: ignore[no-untyped-def]
        import cProfile
        import time

        p = cProfile.Profile(time.process_time)
        p.enable()
        try:
            return _orig(self, *a, **k)
        finally:
            p.disable()
            p.dump_stats(os.path.join(os.environ["WORKER_PROFILE_DIR"], f"{os.getpid()}.prof"))

    _mp.BaseProcess._bootstrap = _bootstrap
