"""The ``shardbench`` command line: parse, validate, then call into a study or the harness.

One module per subcommand (``run``, ``max-size``, ``claim``, ``report``, ``compare``,
``baseline``, ``nightly``, ``trend``, ``export``, ``list``/``env``); each validates every
argument through ``shardbench.harness.validate`` before anything is started or written: a mistake is
one line on stderr naming what is allowed, and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import textwrap
import threading
import traceback

from shardbench.cli.baseline import add_baseline_parser, cmd_baseline
from shardbench.cli.claim import add_claim_parser, cmd_claim
from shardbench.cli.common import UsageError
from shardbench.cli.compare import add_compare_parser, cmd_compare
from shardbench.cli.export import add_export_parser, cmd_export
from shardbench.cli.listing import add_listing_parsers, cmd_env, cmd_list
from shardbench.cli.max_size import add_max_size_parser, cmd_max_size
from shardbench.cli.nightly import add_nightly_parser, cmd_nightly
from shardbench.cli.plan import add_plan_parser, cmd_plan
from shardbench.cli.report import add_report_parser, cmd_report
from shardbench.cli.run import add_run_parser, cmd_run, resolve_cells
from shardbench.cli.trend import add_trend_parser, cmd_trend
from shardbench.harness.guardian import NoPrivateDir
from shardbench.harness.job import current_job

__all__ = ["UsageError", "build_parser", "entry", "main", "resolve_cells"]


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, where it has one worth saying (not None, an
    empty list, nor a switch's: ``--no-charts`` defaults to drawing them, which "(default: True)"
    would say backwards) and the help does not state it already. Lines break only at spaces:
    a name with a hyphen (``torch-zero1``, ``--max-batch``) is never split across two lines."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(
            self._whitespace_matcher.sub(" ", text).strip(),
            width,
            break_on_hyphens=False,
            break_long_words=False,
        )

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            self._whitespace_matcher.sub(" ", text).strip(),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
            break_long_words=False,
        )

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, argparse.SUPPRESS)
            or isinstance(default, bool)  # a switch: its default is the opposite of its name
            or (isinstance(default, list | tuple) and not default)
            or not action.option_strings
        ):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else default
        return f"{text} (default: {shown})"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardbench")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="shardbench",
        description="Memory and throughput benchmarks for distributed PyTorch training strategies.",
        formatter_class=DefaultsHelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"shardbench {_version()}")
    # what runs the cells of more than one process: the job's, set by ``cli.job.in_job``
    ap.set_defaults(job_cells=None)
    sub = ap.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_max_size_parser(sub)
    add_plan_parser(sub)
    add_claim_parser(sub)
    add_report_parser(sub)
    add_compare_parser(sub)
    add_baseline_parser(sub)
    add_nightly_parser(sub)
    add_trend_parser(sub)
    add_export_parser(sub)
    add_listing_parsers(sub)
    _defaults_in_help(ap)
    return ap


def _defaults_in_help(parser: argparse.ArgumentParser) -> None:
    """Set the defaults-showing formatter on every subcommand, at any depth, and give each one
    without a description of its own its one-line help as the description (``shardbench X
    --help`` then says what X is for)."""
    if parser.formatter_class is argparse.HelpFormatter:
        parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                if not child.description and helps.get(name):
                    child.description = helps[name][0].upper() + helps[name][1:] + "."
                _defaults_in_help(child)


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM as an exception, so every command unwinds: the cell launcher's cleanup stops and
    reaps the rank processes in flight (Python's default for SIGTERM is to die on the spot,
    leaving them running). ``run`` installs its own handler while cells run (it records the cell
    as interrupted); this one covers max-size, claim and nightly's searches."""
    raise SystemExit(128 + signum)


#: the exit code of an unexpected exception (a bug), distinct from every command's own codes:
#: 0 success, 1 a failed cell or a regression, 2 a usage error, 130/143 interrupted, 141 the
#: reader of its output went away
INTERNAL_ERROR = 3

#: the exit code when stdout's reader closed it (``shardbench list | head -1``): 128 + SIGPIPE,
#: what a shell reports for a command its pipe's reader left behind
CLOSED_PIPE = 128 + 13


def _stdout_closed() -> bool:
    """Whether stdout's reader has gone: a pipe whose read end is closed polls as an error.
    A broken pipe elsewhere (a rank's socket) is then still reported as the bug it is. Where
    stdout cannot be polled, a broken pipe is taken to be stdout's, as the Python docs do."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):
        return True
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit writes nowhere rather
    than raising a second BrokenPipeError (the Python docs' recipe for SIGPIPE)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


#: the commands that run cells: inside a torchrun or Slurm job every process runs them together
#: (rank 0 leads, the others lend their ranks). Any other command (list, env, report, compare,
#: ...) runs in each process on its own, as on one machine: it has no cells to share.
CELL_COMMANDS = frozenset({"run", "plan", "max-size", "claim", "nightly"})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    handler = {
        "run": cmd_run,
        "max-size": cmd_max_size,
        "plan": cmd_plan,
        "report": cmd_report,
        "claim": cmd_claim,
        "compare": cmd_compare,
        "baseline": cmd_baseline,
        "nightly": cmd_nightly,
        "list": cmd_list,
        "env": cmd_env,
        "trend": cmd_trend,
        "export": cmd_export,
    }[args.command]
    try:
        job = current_job()
    except ValueError as e:  # a launcher's variable that cannot be read: before anything runs
        print(f"shardbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    if job is not None and args.command in CELL_COMMANDS:  # one process of a job (cli/job.py)
        from shardbench.cli.job import in_job

        handler = in_job(job, handler)
    try:
        code = handler(args)
        sys.stdout.flush()  # output still buffered meets a closed pipe here, not at exit
        return code
    except UsageError as e:
        print(f"shardbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    except NoPrivateDir as e:
        print(f"shardbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"shardbench {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug: its own exit code, never compare's "regression" (1)
        if isinstance(e, BrokenPipeError) and _stdout_closed():  # `| head`: normal use, not a bug
            _silence_stdout()
            return CLOSED_PIPE
        traceback.print_exc()
        print(
            f"shardbench {args.command}: internal error ({type(e).__name__}: {e}); exit code "
            f"{INTERNAL_ERROR}: please report it with the traceback above",
            file=sys.stderr,
        )
        return INTERNAL_ERROR
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def entry() -> int:
    """The installed command (and ``python -m shardbench``, ``python -m shardbench.cli``):
    ``main``, then an exit that a late Ctrl-C cannot turn into a traceback. Once the command has
    returned, its records and output are written; a SIGINT arriving while the interpreter shuts
    down (torch unregisters its operator libraries at exit) would otherwise print a
    KeyboardInterrupt traceback from an exit handler. SIGTERM keeps its default, so a stuck exit
    can still be stopped."""
    code = main()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(entry())
