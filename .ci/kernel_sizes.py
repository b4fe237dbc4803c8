"""The kernel layer's largest files and longest functions, in lines.

    python .ci/kernel_sizes.py [--top 5]

A function runs from the first line of its signature to its closing brace,
both at the start of a line (the layout clang-format gives every function
here); one written inside a macro is counted as the macro's lines.
"""
import argparse
import re
from pathlib import Path

KERNELS = Path("csrc/kernels")
SIGNATURE_START = re.compile(r"^(RMS_\w+|static|const|void|int|double|float|size_t|ptrdiff_t|"
                             r"rms_\w+|unsigned)\b[^;]*\(")


def functions(path):
    """(lines, name) of each function defined in the file."""
    lines = path.read_text().splitlines()
    found, start = [], None
    for number, line in enumerate(lines):
        if start is None and SIGNATURE_START.match(line) and not line.rstrip().endswith(";"):
            start = number
        elif start is not None and line.startswith("{"):
            name = re.findall(r"(\w+)\s*\(", " ".join(lines[start:number]))
            end = next(k for k in range(number, len(lines)) if lines[k].startswith("}"))
            found.append((end - start + 1, f"{path}:{start + 1} {name[0] if name else '?'}"))
            start = None
        elif start is not None and line.rstrip().endswith(";"):
            start = None  # a declaration
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    files = sorted(p for p in KERNELS.rglob("*") if p.suffix in (".c", ".h"))
    print("largest files:")
    for count, path in sorted(((len(p.read_text().splitlines()), p) for p in files),
                              reverse=True)[:args.top]:
        print(f"  {count:5d}  {path}")
    print("longest functions:")
    for count, where in sorted((f for p in files for f in functions(p)), reverse=True)[:args.top]:
        print(f"  {count:5d}  {where}")


if __name__ == "__main__":
    main()
