"""`python -m benchmarks`: the tracked benchmarks and the results pages.

    python -m benchmarks list                                  the tracked benchmarks and their quick/full commands
    python -m benchmarks run NAME [--quick|--full] [--record]  run one, print its figures and what moved since
                                                               the last record of it on this CPU kind
    python -m benchmarks render [--check]                      docs/results/ from benchmarks/records/
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "render":
        from benchmarks.render import main as render
        return render(rest)
    if command in ("run", "list"):
        from benchmarks.tracked import main as tracked
        return tracked([command, *rest])
    print(f"error: unknown command {command!r}; one of: list, run, render", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
