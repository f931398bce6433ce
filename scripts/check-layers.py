#!/usr/bin/env python3
"""Import cycles between a crate's modules, from its `crate::`, `super::` and `self::` paths.

STYLE.md ("Layers"): modules form layers with arrows pointing down, so no two sibling
modules may reach each other, directly or around a ring. This reads every .rs file under
each crate's src/, resolves each path it uses to the sibling module it names (at every
level of the module tree: `gate` and `session` under the crate root, `session::opening`
and `session::outbox` under `session`), and reports every ring of siblings. A module
using its own parent's items is not an edge between siblings; test modules (`tests.rs`,
`tests/`, `mod tests { .. }` bodies) are left out: they sit on top and nothing imports them.

    scripts/check-layers.py [crate-dir ...]     # default: gateway services

Exit status 1 when a cycle is found, listing its modules and the edges among them.
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)::\{([^;]*)\}\s*;", re.S)
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+\w+\s*\{")


def module_path(src: Path, file: Path) -> list[str]:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def strip(text: str) -> str:
    """Drops comments, string literals and the bodies of inline `#[cfg(test)] mod`s."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    while (m := TEST_MOD.search(text)) is not None:
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[: m.start()] + text[i:]
    return text


def targets(here: list[str], text: str):
    """Each absolute module path (a list of names) that the file at `here` refers to."""
    found = []
    for m in USE_GROUP.finditer(text):
        for item in re.split(r",(?![^{]*\})", m.group(2)):
            name = item.strip().split("::")[0].split(" ")[0]
            if name and name != "self" and re.fullmatch(r"[A-Za-z_]\w*", name):
                found.append((m.group(1), [name]))
    for m in PATH.finditer(text):
        found.append((m.group(1), m.group(2).split("::")[1:]))
    for root, rest in found:
        if root == "crate":
            base = []
        elif root == "self":
            base = list(here)
        else:
            base = list(here[:-1])
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        yield base + rest


def check(crate: Path) -> list[str]:
    src = crate / "src"
    files = {}
    for file in sorted(src.rglob("*.rs")):
        path = module_path(src, file)
        if "tests" in path or path[-1:] == ["tests"]:
            continue
        files[file] = path
    modules = {tuple(p) for p in files.values()}
    edges = defaultdict(lambda: defaultdict(list))  # parent -> (a, b) -> [file]
    for file, here in files.items():
        text = strip(file.read_text())
        for target in targets(here, text):
            # The longest prefix of the target that is a module of this crate.
            while target and tuple(target) not in modules:
                target = target[:-1]
            if not target:
                continue
            # The first level where the two paths part: an edge between siblings there.
            i = 0
            while i < min(len(here), len(target)) and here[i] == target[i]:
                i += 1
            if i == len(here) or i == len(target):
                continue  # into itself, its children, or its own ancestors
            rel = str(file.relative_to(crate))
            edges[tuple(here[:i])][(here[i], target[i])].append(rel)
    problems = []
    for parent, pairs in sorted(edges.items()):
        graph = defaultdict(set)
        for a, b in pairs:
            graph[a].add(b)
        for ring in cycles(graph):
            where = "::".join(parent) or "crate"
            problems.append(f"{crate.name}: modules in a cycle under {where}: {', '.join(ring)}")
            for (a, b), used_in in sorted(pairs.items()):
                if a in ring and b in ring:
                    problems.append(f"    {a} -> {b}: {', '.join(sorted(set(used_in)))}")
    return problems


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = Path(__file__).resolve().parent.parent
    crates = sys.argv[1:] or ["gateway", "services"]
    problems = [p for c in crates for p in check(root / c)]
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"no import cycles in {', '.join(crates)}")


if __name__ == "__main__":
    main()
