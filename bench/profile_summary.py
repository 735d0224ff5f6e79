"""Summarise py-spy's raw stacks (`py-spy record --format raw`, as BENCH_PROFILE writes them):
the top frames by self time (the leaf) and by cumulative time (anywhere in the stack, once a
sample), as a share of all samples, as a Markdown table. Frames are counted by function and
file, whatever the line.

Run: .venv/bin/python -m bench.profile_summary /tmp/profiles/probot_vm.10 [--top 15]
     [--under 'Worker._process']   (only samples whose stack holds that frame)
"""

from __future__ import annotations

import re
import sys
from collections import Counter

LINE = re.compile(r":\d+\)$")


def _frame(text: str) -> str:
    return LINE.sub(")", text.strip())


def read(path: str, under: str | None = None) -> list[tuple[list[str], int]]:
    stacks: list[tuple[list[str], int]] = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, n = line.rpartition(" ")
            frames = [_frame(s) for s in stack.split(";")]
            if under and not any(under in fr for fr in frames):
                continue
            stacks.append((frames, int(n)))
    return stacks


def summary(stacks: list[tuple[list[str], int]], top: int) -> str:
    total = sum(n for _, n in stacks) or 1
    own: Counter[str] = Counter()
    cum: Counter[str] = Counter()
    for frames, n in stacks:
        own[frames[-1]] += n
        for fr in set(frames):
            cum[fr] += n
    out = [f"{total} samples", "",
           "| self % | frame (self time) | | cumulative % | frame (cumulative) |",
           "|---:|---|---|---:|---|"]
    selfs = own.most_common(top)
    skip = ("<module>", "main (bot/cli/main.py)", "run (asyncio/", "Runner.run", "BaseEventLoop.",
            "Handle._run", "_bootstrap", "Thread.run", "Thread._bootstrap", "thread (",
            "_run_module_as_main", "_run_code")
    cums = [(f, n) for f, n in cum.most_common() if not f.startswith(skip)][:top]
    for i in range(max(len(selfs), len(cums))):
        a = f"{selfs[i][1] / total * 100:.1f} | {selfs[i][0]}" if i < len(selfs) else " | "
        b = f"{cums[i][1] / total * 100:.1f} | {cums[i][0]}" if i < len(cums) else " | "
        out.append(f"| {a} | | {b} |")
    return "\n".join(out)


if __name__ == "__main__":
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 15
    under = sys.argv[sys.argv.index("--under") + 1] if "--under" in sys.argv else None
    for path in [a for a in sys.argv[1:] if not a.startswith("--") and a not in (str(top), under)]:
        print(f"## {path}" + (f" (under {under})" if under else ""))
        print(summary(read(path, under), top))
        print()
