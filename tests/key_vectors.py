#!/usr/bin/env python3
"""Independent computation of idem's golden key vectors.

Implements the key derivation exactly as the module documentation of
idem-runtime/src/key.rs describes it (the canonical encoding table and the
"Key derivation" paragraph), without reading the Rust code, and prints every
vector pinned by idem-runtime/tests/keys.rs and tests/key_vectors.rs.

    python3 tests/key_vectors.py

Standard library only. Each printed line is `<name> <value>`; the Rust
tests hold the same values as literals, so a change on either side shows as
a difference.
"""

import hashlib
import struct

KEY_VERSION = 1
DOMAIN = "idem.key"
NAME_PREFIX_MAX = 64


# Canonical encoding: a one-byte type tag, then a fixed-width or
# length-prefixed payload. Values are modelled as tagged Python tuples so
# that the Rust type of each one is explicit.

def u8(n):
    return ("u8", n)


def u16(n):
    return ("u16", n)


def u32(n):
    return ("u32", n)


def u64(n):
    return ("u64", n)


def i64(n):
    return ("i64", n)


def i8(n):
    return ("i8", n)


def char(c):
    return ("char", c)


def some(v):
    return ("option", v)


NONE = ("option", None)


def seq(*items):
    return ("seq", list(items))


def tup(*items):
    return ("tuple", list(items))


def btree_map(pairs):
    return ("map", sorted(pairs, key=lambda kv: sort_key(kv[0])))


def btree_set(items):
    return ("set", sorted(items, key=sort_key))


def sort_key(v):
    # Ord of the Rust values used here: strings by bytes, chars by scalar.
    if isinstance(v, str):
        return v.encode()
    kind, x = v
    if kind == "char":
        return ord(x)
    return x


INT_TAGS = {
    "u8": (0x02, ">B"),
    "u16": (0x03, ">H"),
    "u32": (0x04, ">I"),
    "u64": (0x05, ">Q"),
    "i8": (0x12, ">b"),
    "i64": (0x15, ">q"),
}


def encode(v):
    """The canonical bytes of one value (str and bool are bare Python)."""
    if isinstance(v, bool):
        return bytes([0x01, 1 if v else 0])
    if isinstance(v, str):
        b = v.encode("utf-8")
        return bytes([0x21]) + struct.pack(">Q", len(b)) + b
    kind, x = v
    if kind in INT_TAGS:
        tag, fmt = INT_TAGS[kind]
        return bytes([tag]) + struct.pack(fmt, x)
    if kind == "char":
        return bytes([0x20]) + struct.pack(">I", ord(x))
    if kind == "option":
        return bytes([0x30, 0]) if x is None else bytes([0x30, 1]) + encode(x)
    if kind == "seq":
        return bytes([0x31]) + struct.pack(">Q", len(x)) + b"".join(map(encode, x))
    if kind == "tuple":
        return bytes([0x32, len(x)]) + b"".join(map(encode, x))
    if kind == "map":
        body = b"".join(encode(k) + encode(val) for k, val in x)
        return bytes([0x33]) + struct.pack(">Q", len(x)) + body
    if kind == "set":
        return bytes([0x34]) + struct.pack(">Q", len(x)) + b"".join(map(encode, x))
    raise ValueError(kind)


def key(root, scope, tool, fields, generation=0):
    """The key text: `{tool}-{sha256 hex}-g{generation}`."""
    stream = (
        encode(DOMAIN)
        + encode(u16(KEY_VERSION))
        + encode(root)
        + encode(seq(*scope))
        + encode(tool)
        + b"".join(map(encode, fields))
        + encode(u32(len(fields)))
    )
    digest = hashlib.sha256(stream).hexdigest()
    prefix = "".join(
        c.lower() if (c.isascii() and c.isalnum()) or c == "_" else "_"
        for c in tool[:NAME_PREFIX_MAX]
    ) or "tool"
    return f"{prefix}-{digest}-g{generation}"


def main():
    email = ["ada@example.com", "receipt", u64(4711)]
    vectors = [
        # idem-runtime/tests/keys.rs, golden_vectors, in order.
        ("keys.rs/0", key("order-4711", [], "send_email", email)),
        ("keys.rs/1", key("order-4711", [], "charge", [u64(4711), u32(1999)])),
        ("keys.rs/2", key("order-4711", ["second-reminder"], "send_email", email)),
        ("keys.rs/3", key("order-4711", [], "charge", [])),
        (
            "keys.rs/4",
            key(
                "order-4711",
                [],
                "charge",
                [
                    some(seq(tup("a", i64(1)))),
                    btree_map([("k", btree_set([char("x"), char("y")]))]),
                    True,
                ],
            ),
        ),
        # tests/key_vectors.rs: keys seen inside real #[tool] calls.
        ("tool/send_email", key("order-4711", [], "send_email", email)),
        (
            "tool/send_email/scope",
            key("order-4711", ["second-reminder"], "send_email", email),
        ),
        ("tool/charge/g0", key("order-4711", [], "charge", [u64(4711), u32(1999)])),
        (
            "tool/charge/g1",
            key("order-4711", [], "charge", [u64(4711), u32(1999)], generation=1),
        ),
        (
            "tool/Shop::refund",
            key("order-4711", [], "Shop::refund", [u64(4711), some("late")]),
        ),
        # Key fields listed in another order than the parameters: the
        # key list's order is the one that counts.
        (
            "tool/transfer",
            key("order-4711", [], "transfer", [u64(4711), "bob", "ada"]),
        ),
    ]
    for name, value in vectors:
        print(name, value)
    # idem-runtime/tests/keys.rs, golden_canonical_bytes.
    print("bytes/4711u64", encode(u64(4711)).hex())
    print("bytes/receipt", encode("receipt").hex())
    print("bytes/Some(-1i8)", encode(some(i8(-1))).hex())


if __name__ == "__main__":
    main()
