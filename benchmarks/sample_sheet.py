"""Samples of the referee's methods side by side, each at the rate its run chose, as one PNG
(each picture twice its size, so that a README shows the digits).

    python benchmarks/sample_sheet.py OUT fashion-full-3x3 --seed 0 --methods grid plain \\
        --out docs/quality/fashion-full-3x3-samples.png

OUT is a `benchmarks/quality.py --out` folder: its table.json says which learning rate each method
was judged at (a sweep's choice) and its samples/ holds the pictures of the samples it scored.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

NAMES = {
    "grid": "the grid",
    "plain": "one GAN, same total steps",
    "indep-regions": "independent GANs on the regions",
    "indep-regions-search": "the same, mixed by the grid's search",
    "indep-best": "best independent GAN",
    "indep-mix": "independent GANs mixed",
}


def picture(out: Path, table: dict, case: str, seed: int, method: str) -> tuple[Image.Image, str]:
    row = next((r for r in table["rows"] if r["case"] == case and r["method"] == method), None)
    if row is None:
        raise SystemExit(f"{out / 'table.json'}: no {method} row for {case}")
    if seed not in table["seeds"]:
        raise SystemExit(f"{out / 'table.json'}: no seed {seed}; it has {table['seeds']}")
    rate = ""
    if row.get("lr"):
        chosen = row["lr"][table["seeds"].index(seed)]
        rate = f"-lr{chosen:g}"
    path = out / "samples" / f"{case}-seed{seed}{rate}-{method}.png"
    if not path.is_file():
        raise SystemExit(f"{path}: missing (was the run made with this benchmarks/quality.py?)")
    score = f"FID {row['fid']['values'][table['seeds'].index(seed)]:.1f}" if "fid" in row else ""
    caption = ": ".join(filter(None, [NAMES.get(method, method), score])) + (f" (lr {chosen:g})" if rate else "")
    image = Image.open(path).convert("RGB")
    return image.resize((image.width * 2, image.height * 2), Image.Resampling.NEAREST), caption


def sheet(pictures: list[tuple[Image.Image, str]], gap: int = 16, caption: int = 28) -> Image.Image:
    width = sum(p.width for p, _ in pictures) + gap * (len(pictures) + 1)
    height = max(p.height for p, _ in pictures) + caption + 2 * gap
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=18)
    x = gap
    for image, text in pictures:
        draw.text((x, gap // 2), text, fill=(20, 20, 20), font=font)
        canvas.paste(image, (x, gap // 2 + caption))
        x += image.width + gap
    return canvas


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a benchmarks/quality.py --out folder")
    parser.add_argument("case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="+", default=["grid", "plain"])
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    table = json.loads((args.run / "table.json").read_text())
    pictures = [picture(args.run, table, args.case, args.seed, m) for m in args.methods]
    sheet(pictures).save(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
