"""Print items/s per benchmark from a pytest-benchmark JSON (bench/test_bench_codec.py).

    python bench/codec_report.py bench/results/codec.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    with open(path) as file:
        data = json.load(file)
    rows = {}
    for bench in data["benchmarks"]:
        items = bench["extra_info"]["items_per_round"]
        rate = items / bench["stats"]["median"]
        rows[bench["name"]] = rate
        print(f"{bench['name']:40s} {rate / 1e6:8.2f} M items/s (median of {bench['stats']['rounds']} rounds)")
    for op in ("decode_messages", "encode_fin", "encode_pub", "encode_mpub_200"):
        c, py = rows.get(f"test_{op}[c]"), rows.get(f"test_{op}[python]")
        if c and py:
            print(f"{op:40s} C is {c / py:5.1f}x the Python twin")
    print(f"machine: {data['machine_info'].get('cpu', {}).get('brand_raw', '?')}, "
          f"Python {data['machine_info']['python_version']}, {data['datetime']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/codec.json")
