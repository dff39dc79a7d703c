#!/usr/bin/env python3
"""No import circle inside src/nvmf or src/pool (issue 34's acceptance).

A module's node is its top-level child of the directory (`nvmf/io/kv.rs` is
`io`); an edge is a `super::X` or `crate::nvmf::X` path to a sibling X in
code outside `#[cfg(test)] mod tests` and comments. The directory's own
mod.rs (its root) is left out: children name their parent's types through
it by design. Prints each circle and exits 1 if there is one.
"""
import glob
import os
import re
import sys

ROOTS = {"src/nvmf": "crate::nvmf::", "src/pool": "crate::pool::"}


def modules(root):
    mods = {}
    for f in glob.glob(os.path.join(root, "**", "*.rs"), recursive=True):
        parts = os.path.relpath(f, root)[:-3].split(os.sep)
        if parts[-1] == "mod":
            parts = parts[:-1]
        if not parts or "tests" in parts:
            continue
        text = re.split(r"#\[cfg\(test\)\]\s*mod tests", open(f).read())[0]
        code = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
        mods.setdefault(parts[0], []).append(code)
    return mods


def edges(mods, prefix):
    out = {m: set() for m in mods}
    for m, texts in mods.items():
        for n in mods:
            if n == m:
                continue
            pat = re.compile(r"(super::|" + re.escape(prefix) + r")" + re.escape(n) + r"\b")
            if any(pat.search(t) for t in texts):
                out[m].add(n)
    return out


def circles(g):
    found = set()

    def walk(a, path):
        for b in sorted(g[a]):
            if b in path:
                c = path[path.index(b):]
                k = c.index(min(c))
                found.add(tuple(c[k:] + c[:k]))
            else:
                walk(b, path + [b])

    for a in sorted(g):
        walk(a, [a])
    return sorted(found)


bad = 0
for root, prefix in ROOTS.items():
    for c in circles(edges(modules(root), prefix)):
        print(f"{root}: import circle: {' -> '.join(c + (c[0],))}")
        bad += 1
sys.exit(1 if bad else 0)
