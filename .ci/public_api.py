#!/usr/bin/env python3
"""The public API of the `idem` facade, one line per item, from rustdoc's
JSON output (`--output-format json`, format version 57 on Rust 1.95).

Usage: public_api.py JSON_DIR > public-api.txt

JSON_DIR holds the JSON of the facade (`idem.json`) and of every workspace
crate it re-exports from (`idem_runtime.json`, `idem_journal.json`, ...).
Starting at the facade's root, it follows modules and re-exports (into the
crate that defines the item) and prints every item reachable by a user:
its kind, its path under `idem::`, and its signature (fields, variants,
function signatures, trait items, inherent methods, trait impls). Items
`#[doc(hidden)]` are left out (they are not API: `__private` is plumbing).
Items of crates outside the workspace (std, serde) are printed as the
re-export only.
"""

import json
import os
import sys

FORMAT = 57


class Crates:
    def __init__(self, directory):
        self.dir = directory
        self.loaded = {}

    def get(self, name):
        if name not in self.loaded:
            path = os.path.join(self.dir, name + ".json")
            if not os.path.exists(path):
                self.loaded[name] = None
            else:
                with open(path) as f:
                    doc = json.load(f)
                if doc["format_version"] != FORMAT:
                    sys.exit(
                        f"{path}: rustdoc JSON format {doc['format_version']}, this script reads "
                        f"{FORMAT} (the toolchain changed: update the script)"
                    )
                by_path = {}
                for id_, p in doc["paths"].items():
                    if p["crate_id"] == 0:
                        by_path.setdefault(tuple(p["path"]), id_)
                doc["by_path"] = by_path
                self.loaded[name] = doc
        return self.loaded[name]


def hidden(item):
    for a in item.get("attrs", []):
        text = a if isinstance(a, str) else json.dumps(a)
        if "doc(hidden)" in text or "Hidden" in text and "doc" in text:
            return True
    return False


def non_exhaustive(item):
    return any(a == "non_exhaustive" for a in item.get("attrs", []))


def generic_args(args):
    if not args:
        return ""
    if "angle_bracketed" in args:
        parts = []
        for a in args["angle_bracketed"]["args"]:
            if "type" in a:
                parts.append(ty(a["type"]))
            elif "lifetime" in a:
                parts.append(a["lifetime"])
            elif "const" in a:
                parts.append(a["const"].get("expr", "_"))
            else:
                parts.append("_")
        for c in args["angle_bracketed"]["constraints"]:
            binding = c.get("binding", {})
            if "equality" in binding:
                eq = binding["equality"]
                parts.append(f"{c['name']} = {ty(eq['type']) if 'type' in eq else '_'}")
            else:
                parts.append(f"{c['name']}: {bounds(binding.get('constraint', []))}")
        return "<" + ", ".join(parts) + ">"
    if "parenthesized" in args:
        p = args["parenthesized"]
        out = "(" + ", ".join(ty(t) for t in p["inputs"]) + ")"
        if p.get("output"):
            out += " -> " + ty(p["output"])
        return out
    return ""


def path(p):
    return p["path"] + generic_args(p.get("args"))


def bounds(bs):
    out = []
    for b in bs:
        if "trait_bound" in b:
            tb = b["trait_bound"]
            prefix = {"maybe": "?", "maybe_const": "~const "}.get(tb.get("modifier"), "")
            out.append(prefix + path(tb["trait"]))
        elif "outlives" in b:
            out.append(b["outlives"])
        else:
            out.append("use<..>")
    return " + ".join(out)


def ty(t):
    if t is None:
        return "()"
    (kind, v), = t.items()
    if kind == "resolved_path":
        return path(v)
    if kind == "generic":
        return v
    if kind == "primitive":
        return v
    if kind == "borrowed_ref":
        life = (v["lifetime"] + " ") if v["lifetime"] else ""
        return "&" + life + ("mut " if v["is_mutable"] else "") + ty(v["type"])
    if kind == "raw_pointer":
        return ("*mut " if v["is_mutable"] else "*const ") + ty(v["type"])
    if kind == "slice":
        return "[" + ty(v) + "]"
    if kind == "array":
        return "[" + ty(v["type"]) + "; " + v["len"] + "]"
    if kind == "tuple":
        return "(" + ", ".join(ty(x) for x in v) + ")"
    if kind == "impl_trait":
        return "impl " + bounds(v)
    if kind == "dyn_trait":
        traits = [path(p["trait"]) for p in v["traits"]]
        if v.get("lifetime"):
            traits.append(v["lifetime"])
        return "dyn " + " + ".join(traits)
    if kind == "qualified_path":
        trait = path(v["trait"]) if v.get("trait") else "_"
        return f"<{ty(v['self_type'])} as {trait}>::{v['name']}"
    if kind == "function_pointer":
        sig = v["sig"]
        return "fn(" + ", ".join(ty(i[1]) for i in sig["inputs"]) + ")" + (
            " -> " + ty(sig["output"]) if sig["output"] else ""
        )
    if kind == "infer":
        return "_"
    if kind == "pat":
        return ty(v["type"])
    return kind


def generics(g):
    params = []
    for p in g["params"]:
        k = p["kind"]
        if "lifetime" in k:
            params.append(p["name"])
        elif "type" in k:
            if k["type"].get("is_synthetic"):
                continue
            b = bounds(k["type"]["bounds"])
            params.append(p["name"] + (": " + b if b else ""))
        elif "const" in k:
            params.append(f"const {p['name']}: {ty(k['const']['type'])}")
    out = "<" + ", ".join(params) + ">" if params else ""
    preds = []
    for w in g["where_predicates"]:
        if "bound_predicate" in w:
            bp = w["bound_predicate"]
            preds.append(ty(bp["type"]) + ": " + bounds(bp["bounds"]))
        elif "lifetime_predicate" in w:
            lp = w["lifetime_predicate"]
            preds.append(lp["lifetime"] + ": " + " + ".join(lp["outlives"]))
        elif "eq_predicate" in w:
            preds.append("_ = _")
    if preds:
        out += " where " + ", ".join(preds)
    return out


def function(name, f):
    h = f["header"]
    quals = "".join(
        q
        for q, on in (("const ", h["is_const"]), ("async ", h["is_async"]), ("unsafe ", h["is_unsafe"]))
        if on
    )
    sig = f["sig"]
    def param(n, t):
        if n == "self":
            shown = ty(t)
            if shown in ("Self", "&Self", "&mut Self"):
                return shown.replace("Self", "self")
        return f"{n}: {ty(t)}"

    inputs = ", ".join(param(n, t) for n, t in sig["inputs"])
    out = f" -> {ty(sig['output'])}" if sig["output"] else ""
    g = generics(f["generics"])
    where = ""
    if " where " in g:
        g, where = g.split(" where ", 1)
        where = " where " + where
    return f"{quals}fn {name}{g}({inputs}){out}{where}"


def tuple_fields(doc, ids):
    """The types of a tuple struct's or variant's fields (`_`: stripped)."""
    return ", ".join(
        ty(doc["index"][str(f)]["inner"]["struct_field"]) if f is not None else "_" for f in ids
    )


class Walker:
    def __init__(self, crates):
        self.crates = crates
        self.lines = set()
        self.seen = set()

    def emit(self, line):
        self.lines.add(line)

    def resolve(self, doc, id_):
        """The crate document and item that `id_` (in `doc`) names, or None
        and the path when it is outside the workspace's JSON."""
        id_ = str(id_)
        if id_ in doc["index"] and doc["index"][id_]["crate_id"] == 0:
            return doc, doc["index"][id_], None
        summary = doc["paths"].get(id_)
        if summary is None:
            return None, None, None
        crate = doc["external_crates"][str(summary["crate_id"])]["name"]
        other = self.crates.get(crate)
        if other is None:
            return None, None, summary
        local = other["by_path"].get(tuple(summary["path"]))
        if local is None or local not in other["index"]:
            return None, None, summary
        return other, other["index"][local], None

    def module(self, doc, item, prefix):
        key = (id(doc), item["id"], prefix)
        if key in self.seen:
            return
        self.seen.add(key)
        for child in item["inner"]["module"]["items"]:
            self.item(doc, doc["index"][str(child)], prefix)

    def item(self, doc, item, prefix, name=None):
        if item.get("visibility") != "public" and "use" not in item["inner"]:
            return
        if hidden(item):
            return
        (kind, inner), = item["inner"].items()
        if kind == "use":
            if item.get("visibility") != "public":
                return
            target_doc, target, summary = self.resolve(doc, inner["id"]) if inner["id"] is not None else (None, None, None)
            if inner["is_glob"]:
                if target is not None and "module" in target["inner"]:
                    self.module(target_doc, target, prefix)
                elif target is not None and "enum" in target["inner"]:
                    for v in target["inner"]["enum"]["variants"]:
                        self.item(target_doc, target_doc["index"][str(v)], prefix)
                else:
                    self.emit(f"use {prefix}::* (from {inner['source']})")
                return
            if target is None:
                what = summary["kind"] if summary else "item"
                self.emit(f"use {what} {prefix}::{inner['name']} (= {inner['source']})")
                return
            self.item(target_doc, target, prefix, name=inner["name"])
            return
        name = name or item["name"]
        here = f"{prefix}::{name}"
        mark = "#[non_exhaustive] " if non_exhaustive(item) else ""
        if kind == "module":
            self.emit(f"mod {here}")
            self.module(doc, item, here)
        elif kind == "struct":
            s = inner
            self.emit(f"{mark}struct {here}{generics(s['generics'])}")
            k = s["kind"]
            if "plain" in k:
                for f in k["plain"]["fields"]:
                    self.field(doc, f, here)
                if k["plain"]["has_stripped_fields"]:
                    self.emit(f"struct {here} has private fields")
            elif "tuple" in k:
                self.emit(f"struct {here}({tuple_fields(doc, k['tuple'])})")
            self.impls(doc, s["impls"], here)
        elif kind == "enum":
            e = inner
            self.emit(f"{mark}enum {here}{generics(e['generics'])}")
            for v in e["variants"]:
                self.variant(doc, doc["index"][str(v)], here)
            self.impls(doc, e["impls"], here)
        elif kind == "union":
            self.emit(f"union {here}")
        elif kind == "function":
            self.emit(f"{function(here, inner)}")
        elif kind == "trait":
            t = inner
            sup = bounds(t["bounds"])
            self.emit(
                f"{'unsafe ' if t['is_unsafe'] else ''}trait {here}{generics(t['generics'])}"
                + (f": {sup}" if sup else "")
            )
            for i in t["items"]:
                self.assoc(doc, doc["index"][str(i)], here)
        elif kind == "type_alias":
            self.emit(f"type {here}{generics(inner['generics'])} = {ty(inner['type'])}")
        elif kind == "constant":
            self.emit(f"const {here}: {ty(inner['type'])}")
        elif kind == "static":
            self.emit(f"static {here}: {ty(inner['type'])}")
        elif kind in ("macro", "proc_macro"):
            self.emit(f"macro {here}")
        else:
            self.emit(f"{kind} {here}")

    def field(self, doc, id_, owner):
        f = doc["index"][str(id_)]
        if f.get("visibility") != "public" or hidden(f):
            return
        self.emit(f"field {owner}::{f['name']}: {ty(f['inner']['struct_field'])}")

    def variant(self, doc, v, owner):
        if hidden(v):
            return
        mark = "#[non_exhaustive] " if non_exhaustive(v) else ""
        k = v["inner"]["variant"]["kind"]
        if k == "plain":
            self.emit(f"{mark}variant {owner}::{v['name']}")
        elif "tuple" in k:
            self.emit(f"{mark}variant {owner}::{v['name']}({tuple_fields(doc, k['tuple'])})")
        elif "struct" in k:
            fields = []
            for f in k["struct"]["fields"]:
                fi = doc["index"][str(f)]
                fields.append(f"{fi['name']}: {ty(fi['inner']['struct_field'])}")
            self.emit(f"{mark}variant {owner}::{v['name']} {{ {', '.join(fields)} }}")

    def assoc(self, doc, i, owner):
        if hidden(i):
            return
        (kind, inner), = i["inner"].items()
        if kind == "function":
            self.emit(function(f"{owner}::{i['name']}", inner))
        elif kind == "assoc_const":
            self.emit(f"const {owner}::{i['name']}: {ty(inner['type'])}")
        elif kind == "assoc_type":
            b = bounds(inner.get("bounds", []))
            self.emit(f"type {owner}::{i['name']}" + (f": {b}" if b else ""))

    def impls(self, doc, ids, owner):
        for id_ in ids:
            imp = doc["index"][str(id_)]
            im = imp["inner"]["impl"]
            if im["is_synthetic"] or im["blanket_impl"] is not None or hidden(imp):
                continue
            if im["trait"] is None:
                for i in im["items"]:
                    it = doc["index"][str(i)]
                    if it.get("visibility") == "public":
                        self.assoc(doc, it, owner)
            else:
                neg = "!" if im["is_negative"] else ""
                self.emit(f"impl {neg}{path(im['trait'])} for {owner}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    crates = Crates(sys.argv[1])
    facade = crates.get("idem")
    if facade is None:
        sys.exit(f"no idem.json in {sys.argv[1]}")
    walker = Walker(crates)
    root = facade["index"][str(facade["root"])]
    walker.module(facade, root, "idem")
    for line in sorted(walker.lines):
        print(line)


if __name__ == "__main__":
    main()
