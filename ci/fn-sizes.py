#!/usr/bin/env python3
"""Sizes of functions and files in the non-test Rust code (issue 55, item 6).

Limits: no function over FN_MAX lines, at most FN_LONG_ALLOWED functions over
FN_LONG lines, no file over FILE_MAX non-test lines.

Non-test code: every `.rs` file under `src/`, `crates/*/src`, `spdk-sys/src`,
`fuzz/src` and the crates' `build.rs`, less `#[cfg(test)]` items (inline
modules, functions, impls) and files that are test modules of their own
(`#[cfg(test)] mod tests;` -> `tests.rs` or `tests/`), and `#[test]`
functions. Integration tests (`tests/`) and benches are test code.

A function's size is its lines from the `fn` keyword to its closing brace,
closures and nested functions included (a nested function is counted on its
own too). A file's size is its line count less the lines of its test items.

Comments, strings and character literals are blanked before braces are
matched, so a `"{"` in a format string does not open a block.

Prints every function over FN_LONG lines (longest first) and every file over
FILE_MAX lines; exits 1 if a limit is broken. `--all N` lists the functions
over N lines instead of FN_LONG.
"""
import glob
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FN_MAX = 100
FN_LONG = 70
FN_LONG_ALLOWED = 15
FILE_MAX = 1200


def source_files():
    pats = [
        "src/**/*.rs",
        "crates/*/src/**/*.rs",
        "crates/*/build.rs",
        "spdk-sys/src/**/*.rs",
        "spdk-sys/build.rs",
        "fuzz/src/**/*.rs",
        "build.rs",
    ]
    out = set()
    for p in pats:
        out.update(glob.glob(os.path.join(ROOT, p), recursive=True))
    return sorted(out)


def blank(text):
    """The text with comments, strings and char literals replaced by spaces
    (newlines kept, so offsets and line numbers stay those of the source)."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            wipe(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}', '{') or a lifetime ('a).
            m = re.compile(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'").match(text, i)
            if m:
                wipe(i, m.end())
                i = m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def matching_brace(code, i):
    """Index after the brace block opening at code[i] == '{'."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


ATTR_TEST = re.compile(r"#\[(?:cfg\(test\)|test)\]")
ITEM_END = re.compile(r"[;{]")


def test_spans(code):
    """(start, end) offsets of items marked #[cfg(test)] or #[test], and the
    names of `#[cfg(test)] mod NAME;` modules kept in files of their own."""
    spans, files = [], set()
    for m in ATTR_TEST.finditer(code):
        if spans and m.start() < spans[-1][1]:
            continue
        e = ITEM_END.search(code, m.end())
        if not e:
            continue
        if e.group() == ";":
            mm = re.search(r"\bmod\s+(\w+)\s*$", code[m.end():e.start()])
            if mm:
                files.add(mm.group(1))
            spans.append((m.start(), e.end()))
        else:
            spans.append((m.start(), matching_brace(code, e.start())))
    return spans, files


FN = re.compile(r"\bfn\s+(\w+)")


def functions(code, spans):
    """(name, first line, lines) of each function with a body outside spans."""
    out = []
    for m in FN.finditer(code):
        if any(a <= m.start() < b for a, b in spans):
            continue
        # The body opens at the first '{' outside parentheses/brackets/angles
        # of the signature; a ';' first means a declaration without body.
        depth, j = 0, m.end()
        while j < len(code):
            c = code[j]
            if c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif depth == 0 and c in ";{":
                break
            j += 1
        if j >= len(code) or code[j] == ";":
            continue
        end = matching_brace(code, j)
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, end - 1) + 1
        out.append((m.group(1), first, last - first + 1))
    return out


def main():
    long_at = FN_LONG
    if len(sys.argv) == 3 and sys.argv[1] == "--all":
        long_at = int(sys.argv[2])
    files = source_files()
    test_files = set()
    parsed = {}
    for f in files:
        code = blank(open(f, encoding="utf-8").read())
        spans, tmods = test_spans(code)
        parsed[f] = (code, spans)
        d = os.path.dirname(f)
        base = os.path.basename(f)[:-3]
        own = d if base in ("mod", "lib", "main") else os.path.join(d, base)
        for t in tmods:
            test_files.add(os.path.join(own, t + ".rs"))
            test_files.add(os.path.join(own, t))
    fns, big_files = [], []
    for f in files:
        if f in test_files or any(f.startswith(t + os.sep) for t in test_files):
            continue
        code, spans = parsed[f]
        rel = os.path.relpath(f, ROOT)
        lines = code.count("\n") + (0 if code.endswith("\n") else 1)
        for a, b in spans:
            lines -= code.count("\n", a, b)
        if lines > FILE_MAX:
            big_files.append((lines, rel))
        for name, first, n in functions(code, spans):
            fns.append((n, f"{rel}:{first}", name))
    fns.sort(key=lambda t: (-t[0], t[1]))
    over_max = [t for t in fns if t[0] > FN_MAX]
    over_long = [t for t in fns if t[0] > FN_LONG]
    for n, where, name in (t for t in fns if t[0] > long_at):
        print(f"{n:5} {where} {name}")
    for n, rel in sorted(big_files, reverse=True):
        print(f"file {n:5} {rel}")
    print(
        f"functions over {FN_MAX} lines: {len(over_max)} (limit 0); "
        f"over {FN_LONG}: {len(over_long)} (limit {FN_LONG_ALLOWED}); "
        f"files over {FILE_MAX} non-test lines: {len(big_files)} (limit 0)"
    )
    bad = over_max or len(over_long) > FN_LONG_ALLOWED or big_files
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
