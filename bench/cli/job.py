"""Any command inside a torchrun or Slurm job: every process runs the same command line, rank 0
runs the command and the others lend it their ranks (``shardbench.harness.job_cells``).

Rank 0 writes everything a local run writes (records, tables, report, a nightly's verdict and
history) and its exit code is the job's: every other process ends with it once rank 0 is done.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from shardbench.cli.common import UsageError
from shardbench.harness.job import Job

Handler = Callable[[argparse.Namespace], int]


def in_job(job: Job, handler: Handler) -> Handler:
    """``handler`` as run by this process of ``job``."""

    def run(args: argparse.Namespace) -> int:
        from shardbench.harness.job_cells import Leader, follow
        from shardbench.harness.job_link import JobError, JobLink
        from shardbench.harness.launch import CellEndsRun

        try:
            link = JobLink(job)
        except JobError as e:
            raise UsageError(str(e)) from None
        with link:
            if job.rank != 0:
                try:
                    return follow(link)
                except JobError as e:
                    kept = "the records rank 0 wrote are kept (continue with --resume in a new job)"
                    print(f"shardbench {args.command} (rank {job.rank}): error: {e}; {kept}", file=sys.stderr)
                    return 1
            hosts = ", ".join(dict.fromkeys(link.hosts))
            print(f"shardbench {args.command}: {job.describe()}, on {hosts}", file=sys.stderr)
            leader, code = Leader(link), None
            args.job_cells = leader.run_cell
            try:
                code = handler(args)
            except CellEndsRun as e:  # from a max-size search or a claim (run stops by itself)
                print(f"shardbench {args.command}: {e.because}; the records written so far are kept",
                      file=sys.stderr)  # fmt: skip
                code = e.exit_code
            except JobError as e:  # the store itself is gone (torchrun's agent ended)
                print(f"shardbench {args.command}: error: {e}; the records written so far are kept",
                      file=sys.stderr)  # fmt: skip
                code = 1
            except UsageError:
                code = 2
                raise
            finally:
                leader.finish(code)
            return code

    return run
