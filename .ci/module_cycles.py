#!/usr/bin/env python3
"""Fails when the files of a crate import each other in a circle.

Usage: module_cycles.py SRC_DIR...

For each crate's src directory: every file is a module (`a/b.rs` and
`a/b/mod.rs` are `a::b`); a file depends on the modules it names through
`crate::...`, `use crate::{...}` or `super::...` (a name the crate root
re-exports counts as the module it comes from); a module's own parent and
children are not dependencies. A strongly connected set of more than one
module is a cycle: printed with its edges, and the exit status is 1.
Comments and `#[cfg(test)] mod tests` at the end of a file are ignored.
This reads text, not the compiler's resolution: a path spelled some other
way (a `use` alias of a module) is not seen.
"""
import os, re, sys
def modules(src):
    # map file -> module path
    out={}
    for dp,_,fs in os.walk(src):
        for f in fs:
            if not f.endswith('.rs'): continue
            p=os.path.join(dp,f); rel=os.path.relpath(p,src)[:-3].split(os.sep)
            if rel[-1] in ('lib','main') and len(rel)==1: mod=()
            elif rel[-1]=='mod': mod=tuple(rel[:-1])
            else: mod=tuple(rel)
            out[mod]=p
    return out
ROOT={}
def root_names(src, mods):
    ROOT.clear()
    for lib in ('lib.rs','main.rs'):
        p=os.path.join(src,lib)
        if not os.path.exists(p): continue
        t=open(p).read()
        for m in re.finditer(r'pub(?:\(crate\))? use (\w+)(?:::(\w+))*::\{([^}]*)\}', t):
            for n in re.findall(r'\w+', m.group(3)): ROOT.setdefault(n, (m.group(1),))
        for m in re.finditer(r'pub(?:\(crate\))? use (\w+)::(?:\w+::)*(\w+);', t):
            ROOT.setdefault(m.group(2), (m.group(1),))
def refs(text, me, mods):
    found=set()
    text=re.sub(r'//[^\n]*','',text)
    for m in re.finditer(r'\bcrate((?:::\w+)+)', text):
        parts=tuple(m.group(1).split('::')[1:])
        for i in range(len(parts),0,-1):
            if parts[:i] in mods: found.add(parts[:i]); break
        else:
            if parts[0] in ROOT and ROOT[parts[0]] in mods: found.add(ROOT[parts[0]])
    for m in re.finditer(r'use crate::\{([^}]*)\}', text):
        for n in re.findall(r'\w+', m.group(1)):
            if (n,) in mods: found.add((n,))
            elif n in ROOT and ROOT[n] in mods: found.add(ROOT[n])
    for m in re.finditer(r'\b((?:super::)+)((?:\w+::)*\w+)', text):
        ups=m.group(1).count('super::'); base=me[:len(me)-ups] if ups<=len(me) else ()
        parts=base+tuple(m.group(2).split('::'))
        for i in range(len(parts),len(base),-1):
            if parts[:i] in mods: found.add(parts[:i]); break
        else:
            if base in mods: found.add(base)
    return found
def main(src):
    mods=modules(src)
    root_names(src, mods)
    g={}
    for mod,p in mods.items():
        t=open(p).read()
        # drop #[cfg(test)] mod tests { ... } blocks crudely: cut at '#[cfg(test)]\nmod'
        i=t.find('#[cfg(test)]\nmod tests')
        if i>=0: t=t[:i]
        r=refs(t,mod,mods)
        # parent/child module relations are not imports
        g[mod]={x for x in r if x!=mod and not (x==mod[:len(x)] ) and not (mod==x[:len(mod)])}
    # find cycles via Tarjan SCC
    idx={};low={};st=[];on=set();res=[];c=[0]
    def sc(v):
        idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
        for w in g.get(v,()):
            if w not in idx: sc(w);low[v]=min(low[v],low[w])
            elif w in on: low[v]=min(low[v],idx[w])
        if low[v]==idx[v]:
            comp=[]
            while True:
                w=st.pop();on.discard(w);comp.append(w)
                if w==v:break
            if len(comp)>1: res.append(comp)
    sys.setrecursionlimit(10000)
    for v in g:
        if v not in idx: sc(v)
    for comp in res:
        print(src, 'cycle:', sorted('::'.join(x) or 'lib' for x in comp))
        for a in comp:
            for b in g[a]:
                if b in comp: print('   ', '::'.join(a),'->','::'.join(b))
    return len(res)
found = 0
for s in sys.argv[1:]:
    found += main(s)
if found:
    sys.exit(f"{found} import cycle(s) between files: make the arrows point one way")
print(f"no import cycle between the files of {len(sys.argv) - 1} crates")
