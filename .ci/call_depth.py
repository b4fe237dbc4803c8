"""The longest call chain from each kernel table entry to the vector vocabulary.

    python .ci/call_depth.py [csrc/kernels/isa_avx512.c] [--limit 7]

Reads one instruction set's kernels as the compiler sees them (``gcc -E``),
finds every function and every table of functions, and follows calls from
each entry of the kernels' table (``rms_kernels_*``) down to a function of
``csrc/kernels/simd/``, the vocabulary. A call through a table of functions
(``rms_forward_block_double_out_of_line[xk][wk](...)``) counts as a call to
each of its entries; every path counts, rare ones too, since a reader
follows them all. Prints the longest chain of each entry, deepest first, and
exits 1 where one is longer than --limit (default: report only).
"""
import argparse
import re
import subprocess
import sys

KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case",
            "__attribute__", "_Alignof", "_Static_assert", "__typeof__", "__asm__", "asm",
            "__builtin_expect"}
LINE_MARKER = re.compile(r'# \d+ "([^"]*)"')
TOKEN = re.compile(r"[A-Za-z_]\w*|\S")


def tokens_of(source):
    """The preprocessed source as (token, file it came from) pairs."""
    text = subprocess.run(["gcc", "-E", "-Icsrc/kernels", "-Icsrc", source],
                          capture_output=True, text=True, check=True).stdout
    tokens, file = [], "?"
    for line in text.splitlines():
        marker = LINE_MARKER.match(line)
        if marker:
            file = marker.group(1)
            continue
        tokens.extend((t, file) for t in TOKEN.findall(line))
    return tokens


def closing(tokens, at, opening, close, step=1):
    """The index of the bracket that closes the one at `at`."""
    depth = 0
    while True:
        if tokens[at][0] == opening:
            depth += 1
        elif tokens[at][0] == close:
            depth -= 1
            if depth == 0:
                return at
        at += step


def definitions(tokens):
    """Functions (name: (file, body)) and tables (name: body of initializer)."""
    functions, tables = {}, {}
    at = 0
    while at < len(tokens):
        if tokens[at][0] != "{":
            at += 1
            continue
        end = closing(tokens, at, "{", "}")
        body = [t for t, _ in tokens[at:end + 1]]
        before = tokens[at - 1][0]
        if before == ")":  # a function: its name precedes the parameter list
            name = tokens[closing(tokens, at - 1, ")", "(", step=-1) - 1][0]
            if name not in KEYWORDS:
                functions[name] = (tokens[at][1], body)
        elif before == "=":  # an initializer: a table where it names functions
            name_at = at - 2
            while tokens[name_at][0] == "]":
                name_at = closing(tokens, name_at, "]", "[", step=-1) - 1
            tables[tokens[name_at][0]] = body
        at = end + 1
    return functions, tables


def call_graph(functions, tables):
    """Each function's callees, a table's entries counting as callees."""
    graph = {}
    for name, (_, body) in functions.items():
        callees = []
        for token, after in zip(body, body[1:]):
            named = [token] if after == "(" else tables.get(token, []) if after == "[" else []
            callees += [c for c in named if c in functions and c != name and c not in callees]
        graph[name] = callees
    return graph


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", default="csrc/kernels/isa_avx512.c")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    functions, tables = definitions(tokens_of(args.source))
    graph = call_graph(functions, tables)

    def is_vocabulary(name):
        return "/simd/" in functions[name][0]

    longest_from = {}

    def longest(name, path=()):
        """The longest chain from name to the vocabulary, or None."""
        if is_vocabulary(name):
            return [name]
        if name in longest_from:
            return longest_from[name]
        best = None
        for callee in graph[name]:
            if callee not in path:
                chain = longest(callee, path + (name,))
                if chain is not None and (best is None or len(chain) + 1 > len(best)):
                    best = [name] + chain
        longest_from[name] = best
        return best

    entry_tables = [t for t in tables if t.startswith("rms_kernels_")]
    if not entry_tables:
        sys.exit(f"{args.source}: no rms_kernels_* table")
    entries = [e for t in entry_tables for e in tables[t] if e in functions]
    chains = sorted((longest(e) or [e] for e in dict.fromkeys(entries)), key=len, reverse=True)
    for chain in chains:
        print(f"{len(chain):2d}  " + " -> ".join(chain))
    if args.limit is not None and len(chains[0]) > args.limit:
        sys.exit(f"deepest chain {len(chains[0])} > {args.limit}")


if __name__ == "__main__":
    main()
