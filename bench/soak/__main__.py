"""The soak's entry point: ``python bench/soak ...`` from the repository root, or
``python -m soak ...`` from bench/ (soak/__init__.py says what it does).

bench/ goes on sys.path (the package and the scripts it imports, rss_watch, are there),
and this folder comes off it: ``python bench/soak`` puts it first, where its modules
(``nodes``, ``report``, ...) would pass for top-level ones.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from soak.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
