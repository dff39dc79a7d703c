#!/usr/bin/env python3
"""No import circle anywhere: between the workspace's crates, between the
modules of each crate, and between the children of each folder inside a crate.

Crates: an edge is a dependency in a crate's Cargo.toml on another crate of
the workspace. Cargo refuses a circle of [dependencies]; one closed by a
[dev-dependencies] entry compiles (into two copies of a crate), so the check
counts both.

Modules: every folder of a crate (its root `src/` and each module with
children) is checked on its own. A reference from a file to a module is an
edge at the deepest folder holding both, from the referring file's child of
that folder to the referred one's: `kvt-nvmf/src/io/kv.rs` naming
`crate::queue` is the edge `io -> queue` of kvt-nvmf's root. References are
`crate::`, `super::` and `self::` paths (in `use` trees too), in code outside
comments and tests (`#[cfg(test)]` modules, inline or in files). A folder's
own root file (`lib.rs`, `mod.rs`) is left out as a source: children name
their parent's types through it by design.

Prints each circle and exits 1 if there is one.
"""
import glob
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def workspace_crates():
    """{package name: directory} of the workspace's members (root Cargo.toml)."""
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    members = re.search(r"^members\s*=\s*\[([^\]]*)\]", text, re.M)
    dirs = [ROOT]
    for m in re.findall(r'"([^"]+)"', members.group(1) if members else ""):
        dirs.extend(sorted(glob.glob(os.path.join(ROOT, m))))
    out = {}
    for d in dirs:
        toml = os.path.join(d, "Cargo.toml")
        if not os.path.exists(toml):
            continue
        m = re.search(r'^\[package\]\s*\nname\s*=\s*"([^"]+)"', open(toml).read(), re.M)
        if m:
            out[m.group(1)] = os.path.normpath(d)
    return out


def crate_edges(crates):
    """{crate: set of workspace crates it depends on}, normal and with dev."""
    normal, with_dev = {}, {}
    for name, d in crates.items():
        normal[name], with_dev[name] = set(), set()
        section = None
        for line in open(os.path.join(d, "Cargo.toml")):
            m = re.match(r"\s*\[([^\]]+)\]", line)
            if m:
                section = m.group(1)
                continue
            m = re.match(r"\s*([\w-]+)\s*(\.|=)", line)
            if not m or m.group(1) not in crates or m.group(1) == name:
                continue
            if section == "dependencies":
                normal[name].add(m.group(1))
                with_dev[name].add(m.group(1))
            elif section == "dev-dependencies":
                with_dev[name].add(m.group(1))
    return normal, with_dev


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(re.sub(r"//.*", "", line) for line in text.split("\n"))


def matching_brace(text, i):
    """Index after the brace block opening at text[i] == '{'."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


TEST_ATTR = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*([;{])")


def without_tests(text):
    """The code outside inline test modules, and the names of test modules
    kept in files of their own."""
    out, files, pos = [], set(), 0
    for m in TEST_ATTR.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos:m.start()])
        if m.group(2) == ";":
            files.add(m.group(1))
            pos = m.end()
        else:
            pos = matching_brace(text, m.end() - 1)
    out.append(text[pos:])
    return "".join(out), files


def module_path(src, f):
    parts = os.path.relpath(f, src)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def use_trees(code):
    """Every path of every `use` tree, as a list of segments."""
    out = []
    for m in re.finditer(r"\buse\s+", code):
        end = code.find(";", m.end())
        tree = re.sub(r"\s+", "", code[m.end():end])
        out.extend(expand(tree))
    return out


def expand(tree):
    """`a::{b, c::{d, self}}` -> [[a, b], [a, c, d], [a, c]]."""
    i = tree.find("{")
    if i < 0:
        return [re.sub(r"\bas\w+$", "", tree).split("::")] if tree else []
    prefix = tree[:i].rstrip(":").split("::") if tree[:i] else []
    inner = tree[i + 1:matching_brace(tree, i) - 1]
    parts, depth, start = [], 0, 0
    for j, c in enumerate(inner):
        depth += c == "{"
        depth -= c == "}"
        if c == "," and depth == 0:
            parts.append(inner[start:j])
            start = j + 1
    parts.append(inner[start:])
    out = []
    for p in parts:
        for sub in expand(p):
            out.append(prefix if sub == ["self"] else prefix + sub)
    return out


def references(code):
    """Paths starting at crate, super or self, in code and in use trees."""
    paths = [p for p in use_trees(code) if p and p[0] in ("crate", "super", "self")]
    for m in re.finditer(r"(?<![\w:$])((?:crate|super|self)(?:::\w+)+)", code):
        paths.append(m.group(1).split("::"))
    return paths


def resolve(path, here):
    """The absolute module path `path` names from the file of module `here`."""
    base, segs = list(here), list(path)
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] == "self":
        segs = segs[1:]
    else:
        # `super` in a file is relative to the module the file is.
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
    return tuple(base + segs)


def crate_modules(src):
    """{module path: code} of a crate's non-test files."""
    files = sorted(glob.glob(os.path.join(src, "**", "*.rs"), recursive=True))
    code, excluded = {}, set()
    for f in files:
        mod = module_path(src, f)
        if "tests" in mod or any(mod[: len(e)] == e for e in excluded):
            continue
        text, test_files = without_tests(strip_comments(open(f).read()))
        excluded.update(mod + (t,) for t in test_files)
        code[mod] = text
    for e in excluded:
        for m in [m for m in code if m[: len(e)] == e]:
            del code[m]
    return code


def folder_edges(code):
    """{folder: {child: set of siblings it names}}."""
    modules = set(code)
    graphs = {}
    for here, text in code.items():
        for path in references(text):
            target = resolve(path, here)
            n = 0
            while n < min(len(here), len(target)) and here[n] == target[n]:
                n += 1
            folder = here[:n]
            if len(here) == n or len(target) == n:
                continue  # a parent and its child, or the folder's own root
            a, b = here[n], target[n]
            if folder + (b,) not in modules:
                continue  # an item of the folder's root file, not a child
            graphs.setdefault(folder, {}).setdefault(a, set()).add(b)
    return graphs


def circles(g):
    found = set()
    nodes = set(g) | {b for bs in g.values() for b in bs}

    def walk(a, path):
        for b in sorted(g.get(a, ())):
            if b in path:
                c = path[path.index(b):]
                k = c.index(min(c))
                found.add(tuple(c[k:] + c[:k]))
            elif len(path) < 12:
                walk(b, path + [b])

    for a in sorted(nodes):
        walk(a, [a])
    return sorted(found)


def main():
    crates = workspace_crates()
    bad = 0
    normal, with_dev = crate_edges(crates)
    compiled = circles(normal)
    for c in compiled:
        print(f"crates: dependency circle: {' -> '.join(c + (c[0],))}")
        bad += 1
    for c in circles(with_dev):
        if c not in compiled:
            print(f"crates: dependency circle through a dev-dependency: {' -> '.join(c + (c[0],))}")
            bad += 1
    folders = 0
    for name, d in sorted(crates.items()):
        src = os.path.join(d, "src")
        graphs = folder_edges(crate_modules(src))
        folders += len(graphs)
        for folder, g in sorted(graphs.items()):
            where = "/".join(folder) or "(root)"
            for c in circles(g):
                print(f"{name} {where}: import circle: {' -> '.join(c + (c[0],))}")
                bad += 1
    if not bad:
        print(f"no import circle: {len(crates)} crates, {folders} folders with imports between their children")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
