"""An older commit's vellum-jobs, draining beside this one in the same run: ``baseline_drain``.

``Baseline(vendor, ref)`` exports ``vellum_jobs/`` of commit ``ref`` (``git
archive``) into a temporary directory and starts this module there as a
subprocess, with that tree first on ``sys.path`` and this checkout's
``benchmarks`` package after it: the same harness code, the older queue. The
subprocess builds its own scratch database (``vellum_bench_base``) with the
older tree's migrations, as the older code expects its schema, then runs a
drain (``benchmarks.vellum.drain``) each time it is asked and prints its
result as one JSON line. Its ``runjobs`` processes start in the older tree
too (``benchmarks.vellum.runjobs`` runs them where ``vellum_jobs`` came from).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
# The code just before limits came in (``rate=``, ``concurrency={...}``);
# ``--baseline`` chooses another commit.
DEFAULT_REF = "0cba687"
DATABASE = "vellum_bench_base"


def export(ref: str) -> tuple[Path, str]:
    """``vellum_jobs/`` of commit ``ref`` in a new temporary directory, and the commit's short hash."""
    commit = _git("rev-parse", "--short", f"{ref}^{{commit}}").strip()
    tree = Path(tempfile.mkdtemp(prefix=f"vellum-baseline-{commit}-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "vellum_jobs"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree, commit


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


class Baseline:
    """The subprocess that drains with commit ``ref``'s code on ``vendor``, started once per run."""

    def __init__(self, vendor: str, ref: str) -> None:
        self.tree, self.commit = export(ref)
        atexit.register(self.close)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.tree), str(ROOT)])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.baseline", "--db", vendor],
            cwd=self.tree,  # first on sys.path: its vellum_jobs, not this checkout's
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._answer()  # ready: database built

    def drain(self, count: int) -> dict[str, Any]:
        """One drain of ``count`` no-op jobs by one ``runjobs --burst --workers 4`` of the older code."""
        stdin = self._pipe(self.process.stdin)
        stdin.write(f"{count}\n")
        stdin.flush()
        return self._answer()

    def _answer(self) -> dict[str, Any]:
        line = self._pipe(self.process.stdout).readline()
        if not line:
            raise RuntimeError(f"the baseline ({self.commit}) exited {self.process.wait()}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"baseline {self.commit}: {answer['error']}")
        return answer

    @staticmethod
    def _pipe(pipe: IO[str] | None) -> IO[str]:
        assert pipe is not None  # opened with PIPE
        return pipe

    def close(self) -> None:
        if self.process.poll() is None:
            self._pipe(self.process.stdin).close()  # its loop ends on end of input
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.tree, ignore_errors=True)


def serve(vendor: str) -> None:
    """In the subprocess: build the database, then a drain per line read (its job count)."""
    import vellum_jobs

    here = Path(vellum_jobs.__file__).resolve().parent.parent
    if here != Path.cwd().resolve():
        raise RuntimeError(f"vellum_jobs came from {here}, not the baseline tree {Path.cwd()}")
    from benchmarks import vellum

    vellum.setup(vendor, DATABASE)
    _say({"ready": True})
    for line in sys.stdin:
        try:
            _say(vellum.drain(1, 4, int(line)))
        except Exception as error:  # noqa: BLE001 - told to the run, which reports it
            _say({"error": f"{type(error).__name__}: {error}"[:300]})


def _say(answer: dict[str, Any]) -> None:
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve(sys.argv[sys.argv.index("--db") + 1])
