#!/usr/bin/env python3
"""deps.py: the dependency graph of meshtrain's sources, for the layering
test (tests/layout/layering.sh) and for people.

Two kinds of arrow join the files under src/: an #include "x.h" (the file
needs what x.h declares) and a call (the file names a function that another
source file defines with external linkage).  The second kind sees what an
include hides: two .c files that call each other through one shared header.

  deps.py cycles SRC            the sets of source files that reach each
                                other by calls (a cycle); exit 1 if any
  deps.py layers SRC ORDER...   every arrow from a folder to a folder after
                                it in ORDER (lowest first), and every file
                                in no folder of ORDER; exit 1 if any.  A
                                file directly in SRC is the umbrella
                                header, above every layer; only
                                meshtrain.h may stand there
  deps.py edges SRC             every call arrow between files, one a line

It reads C as text (comments and strings dropped, definitions found as a
line at column 0 that opens a body), which the code's style makes exact
enough; it does not preprocess, so a call under #if counts too."""
import os, re, sys

SRC_EXT = ('.c', '.cu')
HDR_EXT = ('.h', '.cuh', '.def')

def strip(text):
    text = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), text, flags=re.S)
    text = re.sub(r'//[^\n]*', '', text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\\n])*'", "''", text)
    return text

DEF_RE = re.compile(r'^(?:extern ""[ \t]+)?(?!static\b|typedef\b|extern\b|return\b|else\b)[A-Za-z_][\w \t\*]*?\b(\w+)\s*\(', re.M)

def scan(root):
    files = {}
    for d, _, names in os.walk(root):
        for n in sorted(names):
            if n.endswith(SRC_EXT + HDR_EXT):
                p = os.path.join(d, n)
                files[os.path.relpath(p, root)] = open(p, encoding='utf-8', errors='replace').read()
    info = {}
    for rel, raw in files.items():
        incs = re.findall(r'^\s*#\s*include\s+"([^"]+)"', raw, re.M)
        text = strip(raw)
        defs = set()
        if rel.endswith(SRC_EXT):
            for m in DEF_RE.finditer(text):
                rest = text[m.end():]
                b, s = rest.find('{'), rest.find(';')
                if b >= 0 and (s < 0 or b < s) and m.group(1) not in ('if', 'for', 'while', 'switch'):
                    defs.add(m.group(1))
        info[rel] = {'incs': incs, 'defs': defs, 'toks': set(re.findall(r'\b[A-Za-z_]\w*\b', text))}
    return info

def call_edges(info):
    owner = {}
    for f, i in info.items():
        for d in i['defs']:
            owner.setdefault(d, f)
    edges = {}
    for f, i in info.items():
        if not f.endswith(SRC_EXT):
            continue
        for t in i['toks'] & owner.keys():
            g = owner[t]
            if g != f and t not in i['defs']:
                edges.setdefault((f, g), []).append(t)
    return edges

def header_index(info):
    idx = {}
    for f in info:
        idx.setdefault(os.path.basename(f), f)
    return idx

def sccs(nodes, adj):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(sorted(comp))
    for v in sorted(nodes):
        if v not in index: visit(v)
    return out

def folder(f):
    d = os.path.dirname(f)
    return d if d else '.'

def main(argv):
    if len(argv) < 3:
        print(__doc__); return 2
    cmd, root = argv[1], argv[2]
    info = scan(root)
    edges = call_edges(info)
    if cmd == 'edges':
        for (a, b), syms in sorted(edges.items()):
            print(f'{a} -> {b}: {" ".join(sorted(syms))}')
        return 0
    if cmd == 'cycles':
        adj = {}
        for a, b in edges: adj.setdefault(a, []).append(b)
        bad = [c for c in sccs([f for f in info if f.endswith(SRC_EXT)], adj) if len(c) > 1]
        for c in bad:
            print('cycle: ' + ' '.join(c))
            for a in c:
                for b in c:
                    if (a, b) in edges:
                        print(f'    {a} -> {b}: {" ".join(sorted(edges[(a, b)])[:4])}')
        print(f'{len(bad)} cycle(s) among {sum(f.endswith(SRC_EXT) for f in info)} source files')
        return 1 if bad else 0
    if cmd == 'layers':
        order = argv[3:]
        rank = {l: i for i, l in enumerate(order)}
        rank['.'] = len(order)
        def layer(f):
            d = folder(f)
            while d not in rank and '/' in d: d = d.rsplit('/', 1)[0]
            return d
        idx, bad = header_index(info), 0
        for f in sorted(info):
            if layer(f) not in rank:
                print(f'{f}: folder {folder(f)} is in no layer'); bad += 1
            elif folder(f) == '.' and f != 'meshtrain.h':
                print(f'{f}: stands directly in the source root; only the umbrella header may'); bad += 1
        arrows = []
        for f, i in info.items():
            for h in i['incs']:
                if h in idx: arrows.append((f, idx[h], f'#include "{h}"'))
        for (a, b), syms in edges.items():
            arrows.append((a, b, 'calls ' + ' '.join(sorted(syms)[:3])))
        for a, b, why in sorted(arrows):
            la, lb = layer(a), layer(b)
            if la in rank and lb in rank and rank[lb] > rank[la]:
                print(f'{a} ({la}) uses {b} ({lb}), a higher layer: {why}'); bad += 1
        print(f'{bad} upward arrow(s)')
        return 1 if bad else 0
    print(__doc__); return 2

if __name__ == '__main__':
    sys.exit(main(sys.argv))
