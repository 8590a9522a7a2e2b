"""Write bench/suites/measured/cuda-reserve.toml, the data behind `plan`'s CUDA reserve, from the
committed GPU records (results/gpu/**/records.jsonl) and context measurements
(results/gpu/**/cuda-context.json, written by scripts/measure_cuda_context.py).

Usage: python scripts/derive_cuda_reserve.py [--check]   (--check: exit 1 if the file is stale)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shardbench.records import read_records
from shardbench.studies.plan_reserve import CUDA_RESERVE_FILE, derive

ROOT = Path(__file__).resolve().parent.parent
GPU_RESULTS = ROOT / "results" / "gpu"


#: GPU runs kept as evidence but left out of the reserve, each with why
NOT_RESERVE_DATA = {
    "20261204-173105": (
        "at the same allocated peaks as the 2026-11-30 records, reserved grew by 542 MiB "
        "(deepspeech2, whose FLOPs are now counted on real tensors before the warm-up) and 824 MiB "
        "(imagegpt igpt-l); until the cause is known its figures do not move plan's reserve"
    ),
}


def sources() -> tuple[list[Path], list[Path]]:
    def kept(paths: list[Path]) -> list[Path]:
        return sorted(p for p in paths if p.relative_to(GPU_RESULTS).parts[0] not in NOT_RESERVE_DATA)

    return kept(list(GPU_RESULTS.rglob("records.jsonl"))), kept(list(GPU_RESULTS.rglob("cuda-context.json")))


def render() -> str:
    record_files, context_files = sources()
    contexts = [int(json.loads(p.read_text())["context_bytes"]) for p in context_files]
    data = derive(read_records(record_files), contexts)
    rel = [str(p.relative_to(ROOT)) for p in (*record_files, *context_files)]
    lines = [
        "# The data behind `shardbench plan`'s reserve on CUDA (bench/studies/plan_reserve.py):",
        "# per strategy, the worst max_memory_reserved / max_memory_allocated of its ok cells in the",
        "# committed GPU records; a strategy not listed gets worst_ratio. [context]: the CUDA context",
        "# (device memory outside the caching allocator), absent while it has not been measured.",
        "# Written by scripts/derive_cuda_reserve.py from the files in `sources`; do not edit by hand.",
        f'device = "{data["device"]}"',
        f'torch = "{data["torch"]}"',
        "sources = [",
        *(f'    "{p}",' for p in rel),
        "]",
        f"worst_ratio = {data['worst_ratio']}",
    ]
    if "context" in data:
        c = data["context"]
        lines += ["", "[context]", f"bytes = {c['bytes']}", f"measurements = {c['measurements']}"]
    lines += ["", "[ratio]"]
    for name, entry in data["ratio"].items():
        lines.append(
            f'{name} = {{ ratio = {entry["ratio"]}, records = {entry["records"]}, worst_cell = "{entry["worst_cell"]}" }}'
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        stale = not CUDA_RESERVE_FILE.is_file() or CUDA_RESERVE_FILE.read_text() != text
        print(f"{CUDA_RESERVE_FILE}: {'stale: run scripts/derive_cuda_reserve.py' if stale else 'up to date'}")
        return int(stale)
    CUDA_RESERVE_FILE.parent.mkdir(parents=True, exist_ok=True)
    CUDA_RESERVE_FILE.write_text(text)
    print(f"wrote {CUDA_RESERVE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
