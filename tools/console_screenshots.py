"""Regenerate docs/console/*.png: the console's browser test, with its screenshots kept there.

    python tools/console_screenshots.py [DIR]     (default docs/console)

Runs tests/console/test_browser.py (Debian's chromium, headless) with $FEEDLOG_SCREENSHOTS set
to DIR, then stores each picture with a 64-colour palette (pages are flat colours and text: a
quarter of the bytes, the same to the eye) so the docs stay small.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def shrink(path: Path) -> None:
    from PIL import Image  # matplotlib's dependency: installed with the plot extra

    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else ROOT / "docs" / "console").resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FEEDLOG_SCREENSHOTS": str(out)}
    test = ["-m", "pytest", "-q", "-x", "-p", "no:randomly", str(ROOT / "tests/console/test_browser.py")]
    done = subprocess.run([sys.executable, *test], cwd=ROOT, env=env, check=False)
    if done.returncode != 0:
        return done.returncode
    pictures = sorted(out.glob("*.png"))
    for p in pictures:
        shrink(p)
    total = sum(p.stat().st_size for p in pictures)
    print(f"{len(pictures)} screenshots in {out} ({total / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
