#!/usr/bin/env python3
"""The tree's size limits: no production function over 120 lines and no
production file over 800, so each part can be read in one sitting.

Production code is every .cc and .h under the source folders except tests
(*_test.cc, *_test_util.h, tests/, testing/ folders), fuzz targets and
generated code. Functions are found by brace matching on the source with
comments, strings and preprocessor lines removed: a brace whose header has a
parameter list opens a function (lambdas and local classes count as part of
the function around them).

Usage: size_limits.py ROOT        exits 1 listing what is over, 0 otherwise
       size_limits.py ROOT --top N  also prints the N longest functions
"""
import os
import re
import sys

MAX_FUNCTION_LINES = 120
MAX_FILE_LINES = 800
SOURCE_DIRS = ["bench", "cli", "common", "kernels", "server", "worker"]
# Files allowed over MAX_FILE_LINES, each one cohesive table, with why.
FILE_EXCEPTIONS = {}


def is_production(path):
    name = os.path.basename(path)
    if not name.endswith((".cc", ".h", ".cu", ".cuh")):
        return False
    if name.endswith(("_test.cc", "_test_util.h", "_test.h")) or name.startswith("test_"):
        return False
    parts = path.split(os.sep)
    return not any(p in ("tests", "testing", "fuzz") for p in parts)


def strip(src):
    """The source with comments, string and char literals and preprocessor
    lines blanked (newlines kept, so line numbers stay)."""
    src = re.sub(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*$",
                 lambda m: "\n" * m.group(0).count("\n"), src)
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j))
            i = j
            continue
        raw = re.match(r'R"([^(\s]{0,16})\(', src[i:i + 20])
        if raw and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = ")" + raw.group(1) + '"'
            j = src.find(end, i)
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
            continue
        c = src[i]
        if c == '"' or (c == "'" and not (i > 0 and (src[i - 1].isalnum()))):
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append('""')
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    """(lines, name, first line) of each function defined in `path`."""
    with open(path, errors="replace") as f:
        text = strip(f.read())
    stack, header, found, line = [], "", [], 1
    for ch in text:
        if ch == "\n":
            line += 1
        if ch == "{":
            in_function = any(kind == "f" for kind, _, _ in stack)
            h = header.strip()
            name = ""
            if in_function:
                kind = "o"
            elif h == "" or re.match(r"(namespace|extern)\b", h):
                kind = "n"
            elif re.search(r"\b(class|struct|enum|union)\b", h) and "(" not in h:
                kind = "c"
            elif "(" in h and not h.endswith("="):
                kind = "f"
                names = re.findall(r"([~\w:]+)\s*\(", h)
                name = names[0] if names else h[:40]
            else:
                kind = "o"
            stack.append((kind, line, name))
            header = ""
        elif ch == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "f":
                    found.append((line - first + 1, name, first))
            header = ""
        elif ch == ";":
            header = ""
        else:
            header = (header + ch)[-2000:]
    return found


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    root = argv[1]
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 0
    over, everything = [], []
    for d in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, d)):
            dirnames[:] = sorted(x for x in dirnames if not x.startswith(("build", ".")))
            for f in sorted(filenames):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                if not is_production(rel):
                    continue
                with open(path, errors="replace") as fh:
                    n = sum(1 for _ in fh)
                if n > MAX_FILE_LINES and rel not in FILE_EXCEPTIONS:
                    over.append(f"{rel}: {n} lines (the limit is {MAX_FILE_LINES}: split it "
                                "along a seam, or name it in FILE_EXCEPTIONS with why)")
                for length, name, first in functions(path):
                    everything.append((length, f"{rel}:{first}", name))
                    if length > MAX_FUNCTION_LINES:
                        over.append(f"{rel}:{first}: {name} is {length} lines (the limit is "
                                    f"{MAX_FUNCTION_LINES}: extract named steps)")
    for length, where, name in sorted(everything, reverse=True)[:top]:
        print(f"{length:5d} {where} {name}")
    for o in over:
        print(o)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
