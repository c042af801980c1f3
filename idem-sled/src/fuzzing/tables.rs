//! The fuzz target `tables`: the readers of the journal's immutable
//! files, tables of settled records (`table.rs`) and audit files
//! (`audit.rs`), through the calls the journal makes on them. See
//! `crate::fuzzing` for how targets are written and run.
//!
//! The readers read files, not byte slices: each input is written to a
//! file of a scratch directory of its own (under `$TMPDIR`, which
//! `fuzz/run` points at tmpfs) and opened there, so the code under test is
//! exactly the code the journal runs, `files::open_own` included.

use std::io::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::frames::Outcome;
use crate::audit::{self, AuditFile};
use crate::digest::mix64;
use crate::table::{self, Found, Key, ReadError, Table, KEY_LEN};
use idem_journal::journal::EventRows;
use idem_journal::record::crc32;

/// Flag of [`tables()`]'s first byte: an audit file, not a table.
pub(crate) const AUDIT: u8 = 1;
/// Flag of [`tables()`]'s first byte: the harness writes the file (then
/// damages it) from what the rest of the input describes.
pub(crate) const BUILD: u8 = 2;
/// Flag of [`tables()`]'s first byte: open the file with its size known,
/// as the journal does with the size its manifest recorded.
pub(crate) const SIZE: u8 = 4;
/// Flag of [`tables()`]'s first byte, with [`BUILD`]: the harness writes a
/// table as journal format 4 did, with a classic Bloom filter (else a
/// blocked one, as this build writes).
pub(crate) const CLASSIC: u8 = 8;
/// Bit of a damage operation's first byte: cut the file there.
pub(crate) const TRUNCATE: u8 = 1;
/// Bit of a damage operation's first byte: recompute the checksums that
/// cover the flipped byte.
pub(crate) const FIX: u8 = 2;

/// The id of the file the target opens (its name and its header say it).
const ID: u64 = 0x1d;
/// Bytes of events one input may make the harness write: two chunks of an
/// audit file (64 KiB each) and a third, within what the metering
/// allocator of `fuzz/` allows an input (4 MiB plus 64 times its length).
/// Each costs time: compressing and inflating are most of an input's.
const BUILD_BYTES: usize = 128 << 10;
/// Bytes of values of a built table, and of one value: several pages (8
/// KiB each), none larger than about 12 KiB packed, so that the plain
/// length a damaged page may claim under a recomputed checksum (255 times
/// its packed bytes, the most LZ4 inflates to) stays within the metering
/// allocator's 4 MiB.
const TABLE_BYTES: usize = 64 << 10;
const VALUE_MOST: usize = 4 << 10;
/// Bytes of a damage operation.
const OP_LEN: usize = 5;
/// Bytes of an entry of a built table.
const ENTRY_SPEC: usize = 4;
/// Bytes of an event of a built audit file.
const EVENT_SPEC: usize = 3;

/// A table entry as the reader returns it: the key and the value (`None`:
/// a removal).
type Entry = (Key, Option<Vec<u8>>);

/// The readers of tables (`Table::open`, `get`, `iter_after`,
/// `iter_from`, `verify`) and of audit files (`AuditFile::open`, `read`,
/// `verify`) on files given or built and damaged.
///
/// Input: `[flags][p][q][rest]`. Flag [`AUDIT`] (1) picks an audit file,
/// else a table. Flag [`SIZE`] (4) opens the file with its size known, as
/// the journal does with the size its manifest recorded. Flag [`CLASSIC`]
/// (8) builds a table of the older filter layout. `p` and `q` pick
/// where reads start and how many events they take.
///
/// Raw mode (no flag [`BUILD`]): `rest` is the file (`idem-table.…` or
/// `idem-audit.…`, id `0x1d`).
///
/// With flag [`BUILD`] (2) the harness writes a valid file with the real
/// writer (`table::Writer`, `audit::write`) and then damages it. `rest` is
/// `[param][n][n damage operations][specs]`:
///
/// - a table's specs are entries of 4 bytes, `[k0][k1][kind][len]`. The
///   key is the space `k0 >> 6` (3 stands for `0xff`) and a digest that
///   starts with `k0 & 0x3f, k1` and goes on with bytes hashed from them
///   (all zeros for `0, 0`, all `0xff` for `0x3f, 0xff`). `kind & 1` makes
///   the entry a removal, else it is a value (see below). Entries are
///   sorted by key, the first of equal keys kept; the Bloom filter is sized
///   for `entries × param / 16` of them.
/// - an audit file's specs are events of 3 bytes, `[gap][kind][len]`: the
///   sequence numbers start at `param` (at `u64::MAX - 0xff + param` for a
///   `param` of `0x80` or more), each goes `gap + 1` beyond the previous
///   one (the first: `gap` beyond the start), except that a `gap` of
///   `0xff` jumps as far as leaves room for the events still to come; an
///   event beyond `u64::MAX` is dropped. No event: no file (`Rejected`).
/// - a value (event) is `len << (4 × (kind >> 1 & 3))` bytes, all `len`
///   with `kind & 8`, pseudo-random without; a value at most 4 KiB, at
///   most 64 KiB of values (128 KiB of events) in all.
/// - a damage operation is `[op][region][at: u16 LE][mask]`. `region`
///   (modulo their number) is 0 for the whole file, 1 the header, then
///   each page (chunk), then the Bloom filter (tables only), the page index
///   (chunk directory) and the footer, as the writer laid them out; `at`
///   is an offset in it, modulo its length. With `op &` [`TRUNCATE`] the
///   file is cut there, else the byte is xored with `mask`, and with `op &`
///   [`FIX`] the checksums covering it are recomputed (for the whole file:
///   every checksum): the page's or chunk's, the one the footer holds of the
///   Bloom filter, index or directory, the footer's own, the header's. That
///   is damage that collided with its checksums, and it lets the fuzzer
///   reach the decoders behind them.
///
/// Properties, besides never panicking (and, in `fuzz/`, allocating within
/// a bound linear in the input):
///
/// - a refusal, of the open or of any read, is `ReadError::Damaged` at an
///   offset inside the file (an I/O error is for a file that cannot be
///   read at all, and the harness's always can);
/// - a table that opens: its iteration (`iter_after(None)`) yields
///   strictly increasing keys, and nothing after an error; from a start
///   (`iter_from`, `iter_after(Some)`: the least and the greatest key, and
///   keys `p` and `q` pick, or their neighbours) it yields keys from that
///   start on. If `verify()` passes, the iteration is whole and yields
///   exactly the footer's count of entries; `get` of a key it yields
///   answers that entry, `get` of a key it does not yield (the least and
///   greatest keys, neighbours of the keys checked) is `Found::No`, and
///   iteration from a start is the whole iteration's suffix. (A table that
///   fails `verify` may answer `get` otherwise: its parts disagree, which
///   only a forged checksum makes possible, and the scrub reports it.)
///   The keys `get` checks are a sample, as a `get` inflates a page (half
///   a millisecond under the fuzzer's instrumentation): all of up to 8
///   keys, else 8 spread over them, the first, the last and those `p` and
///   `q` pick.
/// - an audit file that opens: its footer is consistent (`first ≤ last`,
///   between 1 and `last - first + 1` events); `read(from, limit)` leaves
///   what `out` held, yields strictly increasing sequence numbers, at least
///   `from`, in `[first, last]`, no more than `limit` counted with what
///   `out` held; reads from different starts (0, `first`, `last`, `last +
///   1`, and after events `p` and `q` pick) agree with the read from 0
///   where they overlap (exactly, when both succeed); a read with a limit
///   (`q >> 2`, after `q & 3` events in `out`) is a prefix of the read
///   without, and fails only where that one does; if `verify()` passes,
///   reading all of it succeeds with exactly the footer's count of events.
/// - a built file without damage opens, verifies and reads back exactly
///   what was written (tables: keys not written are `Found::No`); a
///   damaged one whose checksums were not recomputed answers only what was
///   written, or damage: what iteration or `read` yields before an error is
///   a prefix of what was written from its start (all of it when no
///   error), `get` answers the written entry (`Found::No` for a key not
///   written) or damage, and the footer's figures are the writer's.
pub fn tables(data: &[u8]) -> Outcome {
    let Some((&[flags, p, q], rest)) = data.split_first_chunk::<3>() else {
        return Outcome::Rejected;
    };
    let scratch = Scratch::new();
    if flags & AUDIT != 0 {
        audit_file(&scratch.0, flags, p, q, rest)
    } else {
        table_file(&scratch.0, flags, p, q, rest)
    }
}

/// How much the harness knows of what the file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Knows {
    /// Nothing: the fuzzer's bytes, or checksums recomputed over damage.
    Nothing,
    /// What was written, damaged under intact checksums: every answer is
    /// what was written, or damage.
    Damaged,
    /// Exactly what was written.
    Intact,
}

/// A directory of its own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = super::sled::scratch_dir("tables");
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `bytes` as the file at `path`, private as the journal's are.
fn put(path: &Path, bytes: &[u8]) {
    let mut f = idem_journal::files::options()
        .create(true)
        .truncate(true)
        .open(path)
        .expect("a scratch file");
    f.write_all(bytes).expect("a scratch file is written");
}

// ------------------------------------------------------------------ tables

fn table_file(dir: &Path, flags: u8, p: u8, q: u8, rest: &[u8]) -> Outcome {
    let path = table::path(dir, ID);
    let (len, written, knows) = if flags & BUILD != 0 {
        let (param, ops, specs) = build_parts(rest);
        let entries = table_entries(specs);
        let layout = if flags & CLASSIC != 0 {
            table::Layout::Classic
        } else {
            table::Layout::Blocked
        };
        let good = write_table(dir, &entries, param, layout);
        let mut bytes = good.clone();
        let forged = damage(&mut bytes, &Layout::of_table(&good), ops);
        put(&path, &bytes);
        let knows = if bytes == good {
            Knows::Intact
        } else if forged {
            Knows::Nothing
        } else {
            Knows::Damaged
        };
        (good.len(), Some(entries), knows)
    } else {
        put(&path, rest);
        (rest.len(), None, Knows::Nothing)
    };
    let size = (flags & SIZE != 0).then_some(len as u64);
    let file_len = std::fs::metadata(&path).expect("the scratch file").len();
    let t = match Table::open(dir, ID, size) {
        Ok(t) => t,
        Err(e) => {
            refusal(e, file_len, "Table::open");
            assert!(knows != Knows::Intact, "a table as written is refused");
            return Outcome::Rejected;
        }
    };
    assert_eq!((t.id, t.bytes), (ID, file_len), "the table's id and size");
    let written = written.as_deref().filter(|_| knows != Knows::Nothing);
    table_reads(&t, file_len, p, q, written, knows);
    Outcome::Decoded
}

/// What reads of an open table must answer (see [`tables()`]).
fn table_reads(t: &Table, len: u64, p: u8, q: u8, written: Option<&[Entry]>, knows: Knows) {
    let verified = match t.verify() {
        Ok(()) => true,
        Err(e) => {
            refusal(e, len, "verify");
            false
        }
    };
    let (all, whole) = iterate(t.iter_after(None), len, "iter_after(None)");
    increasing(&all, None, "iter_after(None)");
    if verified {
        assert!(whole, "the table verifies but its iteration meets damage");
        assert_eq!(
            all.len() as u64,
            t.entries,
            "the table verifies but iterates {} entries, its footer says {}",
            all.len(),
            t.entries
        );
    }
    if let Some(w) = written {
        assert_eq!(t.entries, w.len() as u64, "the footer's count of entries");
        prefix_of(&all, w, whole, "iter_after(None)");
        if knows == Knows::Intact {
            assert!(verified && whole, "a table as written fails to verify");
        }
    }
    // `get` of the keys the iteration yields (a sample: a `get` inflates
    // a page, half a millisecond under the fuzzer's instrumentation).
    let mut gets = Gets::default();
    let pick = |x: u8| usize::from(x) % all.len().max(1);
    for i in sample(all.len(), [pick(p), pick(q)]) {
        let (k, v) = &all[i];
        let want = found(v.as_deref());
        match gets.get(t, k, len) {
            Some(got) => assert!(
                *got == want || !verified,
                "get({}) says {got:?}, the iteration {want:?}",
                hex(k)
            ),
            None => assert!(!verified, "get({}) reports damage, verify none", hex(k)),
        }
    }
    // Iterations from a start.
    let pick = |x: u8| all.get(pick(x)).map(|e| e.0);
    let mut starts = vec![([0u8; KEY_LEN], false), ([0xff; KEY_LEN], true)];
    if let Some(k) = pick(p) {
        starts.push((k, false));
    }
    if let Some(k) = pick(q) {
        let k = match (q >> 1) % 3 {
            0 => k,
            1 => step(k, false),
            _ => step(k, true),
        };
        starts.push((k, q & 1 == 1));
    }
    for (start, included) in starts {
        let what = format!("iter_from({}, {included})", hex(&start));
        let it = if included {
            t.iter_from(&start, true)
        } else {
            t.iter_after(Some(&start))
        };
        let (got, complete) = iterate(it, len, &what);
        increasing(&got, Some((&start, included)), &what);
        let after = |k: &Key| *k > start || (included && *k == start);
        if verified {
            let want: Vec<&Entry> = all.iter().filter(|e| after(&e.0)).collect();
            assert!(complete, "{what}: damage in a table that verifies");
            assert!(
                got.iter().eq(want.iter().copied()),
                "{what}: not the whole iteration's suffix"
            );
        }
        if let Some(w) = written {
            let want: Vec<Entry> = w.iter().filter(|e| after(&e.0)).cloned().collect();
            prefix_of(&got, &want, complete, &what);
        }
    }
    // `get` of keys the iteration does not yield, and of what was written
    // (a sample too).
    let mut probes = vec![[0u8; KEY_LEN], [0xff; KEY_LEN]];
    for k in [pick(p), pick(q)].into_iter().flatten() {
        probes.extend([step(k, false), step(k, true)]);
    }
    let written_sample = written.map_or_else(Vec::new, |w| sample(w.len(), []));
    if let Some(w) = written {
        for &i in &written_sample {
            probes.extend([step(w[i].0, false), step(w[i].0, true)]);
        }
    }
    probes.retain(|k| all.binary_search_by(|e| e.0.cmp(k)).is_err());
    for k in &probes {
        match gets.get(t, k, len) {
            Some(got) => assert!(
                *got == Found::No || !verified,
                "get({}) says {got:?} of a key the iteration does not yield",
                hex(k)
            ),
            None => assert!(!verified, "get({}) reports damage, verify none", hex(k)),
        }
    }
    if let Some(w) = written {
        let absent = probes
            .iter()
            .filter(|k| w.binary_search_by(|e| e.0.cmp(k)).is_err());
        for (k, want) in written_sample
            .iter()
            .map(|&i| (&w[i].0, found(w[i].1.as_deref())))
            .chain(absent.map(|k| (k, Found::No)))
        {
            match gets.get(t, k, len) {
                Some(got) => assert!(*got == want, "get({}) says {got:?}, not {want:?}", hex(k)),
                None => assert!(
                    knows != Knows::Intact,
                    "get({}) of a table as written reports damage",
                    hex(k)
                ),
            }
        }
    }
}

/// What `get` answered of each key asked (`None`: damage).
#[derive(Default)]
struct Gets(std::collections::BTreeMap<Key, Option<Found>>);

impl Gets {
    fn get(&mut self, t: &Table, k: &Key, len: u64) -> Option<&Found> {
        self.0
            .entry(*k)
            .or_insert_with(|| match t.get(k) {
                Ok(found) => Some(found),
                Err(e) => {
                    refusal(e, len, "get");
                    None
                }
            })
            .as_ref()
    }
}

/// Which of `n` items to check: all of up to 8, else 8 spread over
/// them, the first, the last and `picks`.
fn sample<const N: usize>(n: usize, picks: [usize; N]) -> Vec<usize> {
    const MOST: usize = 8;
    if n <= MOST {
        return (0..n).collect();
    }
    let mut out: Vec<usize> = (0..MOST).map(|i| i * n / MOST).collect();
    out.push(n - 1);
    out.extend(picks.iter().filter(|&&i| i < n));
    out.sort_unstable();
    out.dedup();
    out
}

fn found(v: Option<&[u8]>) -> Found {
    match v {
        Some(v) => Found::Value(v.to_vec()),
        None => Found::Removed,
    }
}

/// What an iteration yields up to its end or its first error (then
/// `false`), which must end it.
fn iterate(mut it: table::Iter<'_>, len: u64, what: &str) -> (Vec<Entry>, bool) {
    let mut out = Vec::new();
    while let Some(item) = it.next() {
        match item {
            Ok(e) => out.push(e),
            Err(e) => {
                refusal(e, len, what);
                assert!(
                    it.next().is_none(),
                    "{what}: the iteration goes on after damage"
                );
                return (out, false);
            }
        }
    }
    (out, true)
}

/// Keys strictly increasing, from `start` (included or not) on.
fn increasing(entries: &[Entry], start: Option<(&Key, bool)>, what: &str) {
    if let Some(i) = entries.windows(2).position(|w| w[0].0 >= w[1].0) {
        panic!(
            "{what}: key {} then {} (entries {i} and {})",
            hex(&entries[i].0),
            hex(&entries[i + 1].0),
            i + 1
        );
    }
    if let (Some((start, included)), Some(first)) = (start, entries.first()) {
        assert!(
            first.0 > *start || (included && first.0 == *start),
            "{what}: yields {} before its start",
            hex(&first.0)
        );
    }
}

/// `got` is a prefix of `want`, all of it when `whole`.
fn prefix_of<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T], whole: bool, what: &str) {
    let same = got.iter().zip(want).take_while(|(a, b)| a == b).count();
    assert!(
        same == got.len(),
        "{what}: item {same} of {} is not what was written",
        got.len()
    );
    assert!(
        !whole || got.len() == want.len(),
        "{what}: {} items without an error, {} written",
        got.len(),
        want.len()
    );
}

/// The key just below (`up == false`) or above `k`, wrapping.
fn step(mut k: Key, up: bool) -> Key {
    for b in k.iter_mut().rev() {
        let (v, carry) = if up {
            b.overflowing_add(1)
        } else {
            b.overflowing_sub(1)
        };
        *b = v;
        if !carry {
            break;
        }
    }
    k
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `[param][n][n damage operations][specs]`, cut where the input ends.
fn build_parts(rest: &[u8]) -> (u8, &[u8], &[u8]) {
    let param = rest.first().copied().unwrap_or(0);
    let n = usize::from(rest.get(1).copied().unwrap_or(0));
    let rest = rest.get(2..).unwrap_or_default();
    let (ops, specs) = rest.split_at((n * OP_LEN).min(rest.len()));
    (param, ops, specs)
}

/// The key of an entry spec (see [`tables()`]).
fn spec_key(k0: u8, k1: u8) -> Key {
    let space = match k0 >> 6 {
        3 => 0xff,
        s => s,
    };
    let mut d = [0u8; 32];
    match (k0 & 0x3f, k1) {
        (0, 0) => {}
        (0x3f, 0xff) => d = [0xff; 32],
        (a, b) => {
            d[0] = a;
            d[1] = b;
            let mut h = u64::from(a) << 8 | u64::from(b);
            for c in d[2..].chunks_mut(8) {
                h = mix64(h.wrapping_add(0x9e37_79b9_7f4a_7c15));
                c.copy_from_slice(&h.to_le_bytes()[..c.len()]);
            }
        }
    }
    table::key(space, &d)
}

/// The bytes of a value or event (see [`tables()`]): at most `most`, and
/// within `budget`.
fn content(seed: u64, kind: u8, len: u8, most: usize, budget: &mut usize) -> Vec<u8> {
    let n = (usize::from(len) << (4 * ((kind >> 1) & 3)))
        .min(most)
        .min(*budget);
    *budget -= n;
    if kind & 8 != 0 {
        return vec![len; n];
    }
    let mut h = seed;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        h = mix64(h.wrapping_add(0x9e37_79b9_7f4a_7c15));
        let take = (n - out.len()).min(8);
        out.extend_from_slice(&h.to_le_bytes()[..take]);
    }
    out
}

/// The entries the specs describe, in key order.
fn table_entries(specs: &[u8]) -> Vec<Entry> {
    let mut budget = TABLE_BYTES;
    let mut out: Vec<Entry> = specs
        .chunks_exact(ENTRY_SPEC)
        .map(|s| {
            let k = spec_key(s[0], s[1]);
            let seed = u64::from_le_bytes(k[1..9].try_into().unwrap_or_default());
            let v = (s[2] & 1 == 0).then(|| content(seed, s[2], s[3], VALUE_MOST, &mut budget));
            (k, v)
        })
        .collect();
    // Stable: of equal keys, the first described stays first and is kept.
    out.sort_by_key(|e| e.0);
    out.dedup_by(|later, first| later.0 == first.0);
    out
}

/// Writes table [`ID`] of `entries` with the journal's writer; its bytes.
fn write_table(dir: &Path, entries: &[Entry], param: u8, layout: table::Layout) -> Vec<u8> {
    let expected = entries.len() as u64 * u64::from(param) / 16;
    let mut w = table::Writer::create_as(dir, ID, expected, layout).expect("a scratch table");
    for (k, v) in entries {
        w.add(k, v.as_deref()).expect("entries in key order");
    }
    let written = w.finish().expect("a table is written");
    let bytes = std::fs::read(table::path(dir, ID)).expect("the table written");
    assert_eq!(written.bytes, bytes.len() as u64);
    assert_eq!(written.entries, entries.len() as u64);
    bytes
}

// ------------------------------------------------------------- audit files

fn audit_file(dir: &Path, flags: u8, p: u8, q: u8, rest: &[u8]) -> Outcome {
    let path = audit::path(dir, ID);
    let (len, written, knows) = if flags & BUILD != 0 {
        let (param, ops, specs) = build_parts(rest);
        let events = audit_events(param, specs);
        if events.is_empty() {
            return Outcome::Rejected;
        }
        let w = audit::write(dir, ID, events.iter().map(|(s, b)| (*s, &b[..])))
            .expect("an audit file is written");
        let good = std::fs::read(&path).expect("the audit file written");
        assert_eq!(w.bytes, good.len() as u64);
        let mut bytes = good.clone();
        let forged = damage(&mut bytes, &Layout::of_audit(&good), ops);
        put(&path, &bytes);
        let knows = if bytes == good {
            Knows::Intact
        } else if forged {
            Knows::Nothing
        } else {
            Knows::Damaged
        };
        (good.len(), Some(events), knows)
    } else {
        put(&path, rest);
        (rest.len(), None, Knows::Nothing)
    };
    let size = (flags & SIZE != 0).then_some(len as u64);
    let file_len = std::fs::metadata(&path).expect("the scratch file").len();
    let f = match AuditFile::open(dir, ID, size) {
        Ok(f) => f,
        Err(e) => {
            refusal(e, file_len, "AuditFile::open");
            assert!(
                knows != Knows::Intact,
                "an audit file as written is refused"
            );
            return Outcome::Rejected;
        }
    };
    let written = written.as_deref().filter(|_| knows != Knows::Nothing);
    audit_reads(&f, file_len, p, q, written, knows);
    Outcome::Decoded
}

/// The events the specs describe (see [`tables()`]).
fn audit_events(param: u8, specs: &[u8]) -> EventRows {
    let mut budget = BUILD_BYTES;
    let mut next = if param < 0x80 {
        Some(u64::from(param))
    } else {
        Some(u64::MAX - 0xff + u64::from(param))
    };
    let mut out = Vec::new();
    let n = specs.len() / EVENT_SPEC;
    for (i, s) in specs.chunks_exact(EVENT_SPEC).enumerate() {
        let Some(at) = next else { break };
        let seq = if s[0] == 0xff {
            (u64::MAX - (n - 1 - i) as u64).max(at)
        } else {
            match at.checked_add(u64::from(s[0])) {
                Some(seq) => seq,
                None => break,
            }
        };
        out.push((seq, content(seq, s[1], s[2], usize::MAX, &mut budget)));
        next = seq.checked_add(1);
    }
    out
}

/// What reads of an open audit file must answer (see [`tables()`]).
fn audit_reads(
    f: &AuditFile,
    len: u64,
    p: u8,
    q: u8,
    written: Option<&[(u64, Vec<u8>)]>,
    knows: Knows,
) {
    assert!(
        f.first <= f.last && f.events >= 1 && f.events - 1 <= f.last - f.first,
        "an open audit file's footer says {} events from {} to {}",
        f.events,
        f.first,
        f.last
    );
    if let Some(w) = written {
        let (first, last) = (w[0].0, w[w.len() - 1].0);
        assert_eq!(
            (f.first, f.last, f.events),
            (first, last, w.len() as u64),
            "the footer's figures are not the writer's"
        );
    }
    let verified = match f.verify() {
        Ok(()) => true,
        Err(e) => {
            refusal(e, len, "verify");
            false
        }
    };
    let read = |from: u64, limit: usize, before: usize| read_events(f, len, from, limit, before);
    let (all, all_ok) = read(0, usize::MAX, 0);
    if verified {
        assert!(
            all_ok,
            "the audit file verifies but reading it meets damage"
        );
        assert_eq!(
            all.len() as u64,
            f.events,
            "the audit file verifies but reads {} events, its footer says {}",
            all.len(),
            f.events
        );
    }
    if knows == Knows::Intact {
        assert!(verified, "an audit file as written fails to verify");
    }
    let mid = all
        .get(usize::from(p) % all.len().max(1))
        .map_or(f.first.saturating_add(u64::from(p)), |e| e.0);
    let other = all
        .get(usize::from(q) % all.len().max(1))
        .map_or(f.last.saturating_sub(u64::from(q)), |e| {
            e.0.saturating_add(1)
        });
    let froms = [0, f.first, mid, other, f.last, f.last.saturating_add(1)];
    for from in froms {
        let (got, ok) = read(from, usize::MAX, 0);
        let from_all: Vec<_> = all.iter().filter(|e| e.0 >= from).cloned().collect();
        let n = got.len().min(from_all.len());
        assert!(
            got[..n] == from_all[..n],
            "read({from}) and read(0) disagree where they overlap"
        );
        if ok && all_ok {
            assert!(
                got == from_all,
                "read({from}) is not what read(0) holds from {from}"
            );
        }
        if let Some(w) = written {
            let want: Vec<_> = w.iter().filter(|e| e.0 >= from).cloned().collect();
            prefix_of(&got, &want, ok, &format!("read({from})"));
        }
        if from == mid {
            // The same read with a limit, after what `out` held.
            let (limit, before) = (usize::from(q >> 2), usize::from(q & 3));
            let (few, few_ok) = read(from, limit, before);
            let room = limit.saturating_sub(before);
            if few_ok {
                assert!(
                    few[..] == got[..got.len().min(room)],
                    "read({from}, {limit}) after {before}: not the first of read({from})"
                );
            } else {
                assert!(!ok, "read({from}, {limit}) meets damage, read({from}) none");
                assert!(
                    got.starts_with(&few),
                    "read({from}, {limit}) after {before}: not a prefix of read({from})"
                );
            }
        }
    }
}

/// `read(from, limit)` into an `out` holding `before` events: the events
/// it added, and whether it succeeded.
fn read_events(
    f: &AuditFile,
    len: u64,
    from: u64,
    limit: usize,
    before: usize,
) -> (EventRows, bool) {
    let held: EventRows = (0..before as u64)
        .map(|i| (u64::MAX - i, b"held".to_vec()))
        .collect();
    let mut out = held.clone();
    let what = format!("read({from}, {limit}) after {before}");
    let ok = match f.read(from, limit, &mut out) {
        Ok(()) => true,
        Err(e) => {
            refusal(e, len, &what);
            false
        }
    };
    assert!(out.starts_with(&held), "{what}: changed what `out` held");
    let got = out.split_off(before);
    assert!(
        got.len() <= limit.saturating_sub(before),
        "{what}: {} events added",
        got.len()
    );
    if let Some(i) = got.windows(2).position(|w| w[0].0 >= w[1].0) {
        panic!("{what}: event {} then {}", got[i].0, got[i + 1].0);
    }
    if let (Some(a), Some(z)) = (got.first(), got.last()) {
        assert!(
            a.0 >= from && a.0 >= f.first && z.0 <= f.last,
            "{what}: events {} to {}, from {from}, of a file from {} to {}",
            a.0,
            z.0,
            f.first,
            f.last
        );
    }
    (got, ok)
}

// ------------------------------------------------------------------ damage

/// The refusal a reader may answer: damage inside the file.
fn refusal(e: ReadError, len: u64, what: &str) {
    match e {
        ReadError::Damaged(d) => assert!(
            d.offset <= len,
            "{what}: damage at offset {} of a {len}-byte file: {}",
            d.offset,
            d.detail
        ),
        ReadError::Io(e) => panic!("{what}: an I/O error on a readable file: {e}"),
    }
}

/// What a region of a file is, for recomputing its checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    File,
    Header,
    /// A table's page or an audit file's chunk.
    Page,
    Bloom,
    /// A table's page index or an audit file's chunk directory.
    Index,
    Footer,
}

/// Where a valid file's parts are, as its writer laid them out.
struct Layout {
    regions: Vec<(Part, Range<usize>)>,
    /// Bytes of a page's (chunk's) frame before its packed bytes; the
    /// checksum is their last four.
    page_head: usize,
    footer: Range<usize>,
    /// Where the footer holds the checksums of the Bloom filter and of the
    /// index (directory).
    bloom_crc: usize,
    index_crc: usize,
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default()) as usize
}

fn u64_at(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default()) as usize
}

impl Layout {
    /// The layout of a table the writer wrote (the module's doc).
    fn of_table(b: &[u8]) -> Layout {
        let foot = b.len() - table::FOOTER_LEN;
        let f = &b[foot..];
        let (bloom_at, bloom_len) = (u64_at(f, 12), u32_at(f, 20));
        let (index_at, index_len) = (u64_at(f, 29), u32_at(f, 37));
        let mut regions = vec![
            (Part::File, 0..b.len()),
            (Part::Header, 0..table::HEADER_LEN),
        ];
        for e in b[index_at..index_at + index_len].chunks_exact(table::INDEX_ENTRY) {
            let (at, len) = (u64_at(e, KEY_LEN), u32_at(e, KEY_LEN + 8));
            regions.push((Part::Page, at..at + len));
        }
        regions.push((Part::Bloom, bloom_at..bloom_at + bloom_len));
        regions.push((Part::Index, index_at..index_at + index_len));
        regions.push((Part::Footer, foot..b.len()));
        Layout {
            regions,
            page_head: table::PAGE_HEAD,
            footer: foot..b.len(),
            bloom_crc: foot + 25,
            index_crc: foot + 41,
        }
    }

    /// The layout of an audit file the writer wrote (the module's doc).
    fn of_audit(b: &[u8]) -> Layout {
        let foot = b.len() - audit::FOOTER_LEN;
        let f = &b[foot..];
        let (dir_at, dir_len) = (u64_at(f, 28), u32_at(f, 36));
        let mut regions = vec![
            (Part::File, 0..b.len()),
            (Part::Header, 0..audit::HEADER_LEN),
        ];
        for e in b[dir_at..dir_at + dir_len].chunks_exact(audit::DIR_ENTRY) {
            let (at, len) = (u64_at(e, 16), u32_at(e, 24));
            regions.push((Part::Page, at..at + len));
        }
        regions.push((Part::Index, dir_at..dir_at + dir_len));
        regions.push((Part::Footer, foot..b.len()));
        Layout {
            regions,
            page_head: audit::CHUNK_HEAD,
            footer: foot..b.len(),
            bloom_crc: usize::MAX,
            index_crc: foot + 40,
        }
    }

    /// Recomputes the checksums covering region `i` (what of them is still
    /// in the file).
    fn fix(&self, b: &mut [u8], i: usize) {
        let (part, r) = (self.regions[i].0, self.regions[i].1.clone());
        let set = |b: &mut [u8], at: usize, crc: u32| {
            if let Some(dst) = b.get_mut(at..at + 4) {
                dst.copy_from_slice(&crc.to_le_bytes());
            }
        };
        let whole = |b: &[u8], r: &Range<usize>| r.end <= b.len();
        match part {
            Part::File => {
                // Every region but the whole file, the footer last.
                for j in 1..self.regions.len() {
                    self.fix(b, j);
                }
                return;
            }
            Part::Header => {
                if whole(b, &r) {
                    let crc = crc32(&b[..16]);
                    set(b, 16, crc);
                }
                return;
            }
            Part::Page => {
                if whole(b, &r) {
                    let at = r.start + self.page_head - 4;
                    let covered = [&b[r.start..at], &b[r.start + self.page_head..r.end]].concat();
                    set(b, at, crc32(&covered));
                }
                return;
            }
            Part::Bloom | Part::Index if whole(b, &r) && whole(b, &self.footer) => {
                let at = if part == Part::Bloom {
                    self.bloom_crc
                } else {
                    self.index_crc
                };
                let crc = crc32(&b[r]);
                set(b, at, crc);
            }
            _ => {}
        }
        if whole(b, &self.footer) {
            let end = self.footer.end - 4;
            let crc = crc32(&b[self.footer.start..end]);
            set(b, end, crc);
        }
    }
}

/// Applies damage operations (see [`tables()`]); whether checksums were
/// recomputed.
fn damage(bytes: &mut Vec<u8>, layout: &Layout, ops: &[u8]) -> bool {
    let mut forged = false;
    for op in ops.chunks_exact(OP_LEN) {
        let i = usize::from(op[1]) % layout.regions.len();
        let r = &layout.regions[i].1;
        let at = usize::from(u16::from_le_bytes([op[2], op[3]]));
        if op[0] & TRUNCATE != 0 {
            bytes.truncate(r.start + at % (r.len() + 1));
            continue;
        }
        if r.is_empty() {
            continue;
        }
        let Some(b) = bytes.get_mut(r.start + at % r.len()) else {
            continue;
        };
        *b ^= op[4];
        if op[0] & FIX != 0 {
            layout.fix(bytes, i);
            forged = true;
        }
    }
    forged
}

// ------------------------------------------------------------------- seeds

/// Seeds: for each kind, a file as written (raw), the same described to
/// the harness (built), and built with damage whose checksums were
/// recomputed (in a page or chunk, in the footer).
pub(crate) fn tables_seeds() -> Vec<(String, Vec<u8>)> {
    // 40 entries in four spaces, a few removals, values small and random
    // or large and repetitive: two pages.
    let mut entries = Vec::new();
    for i in 0..40u8 {
        let kind = match i % 5 {
            3 => 1,
            0 | 2 => 8 | 2,
            _ => 0,
        };
        entries.extend([i.wrapping_mul(6), i.wrapping_mul(37), kind, 20 + i]);
    }
    // 30 events, one gap, three of 20 KiB or more: two chunks.
    let mut events = Vec::new();
    for i in 0..30u8 {
        let gap = if i == 12 { 3 } else { 0 };
        let (kind, len) = if i % 10 == 4 {
            (8 | 4, 80 + i)
        } else {
            (0, 10 + i)
        };
        events.extend([gap, kind, len]);
    }
    let built = |flags: u8, param: u8, ops: &[[u8; OP_LEN]], specs: &[u8]| {
        let mut input = vec![BUILD | flags, 7, 9, param, ops.len() as u8];
        input.extend(ops.iter().flatten());
        input.extend_from_slice(specs);
        input
    };
    let raw = |flags: u8, file: Vec<u8>| {
        let mut input = vec![flags, 7, 9];
        input.extend(file);
        input
    };
    let scratch = Scratch::new();
    let table_bytes = write_table(
        &scratch.0,
        &table_entries(&entries),
        16,
        table::Layout::Blocked,
    );
    std::fs::remove_file(table::path(&scratch.0, ID)).expect("written");
    let classic_bytes = write_table(
        &scratch.0,
        &table_entries(&entries),
        16,
        table::Layout::Classic,
    );
    let ev = audit_events(1, &events);
    audit::write(&scratch.0, ID, ev.iter().map(|(s, b)| (*s, &b[..]))).expect("written");
    let audit_bytes = std::fs::read(audit::path(&scratch.0, ID)).expect("written");
    // Region 2 is the first page (chunk); the last region the footer.
    let page = [FIX, 2, 40, 0, 0x10];
    let footer = |layout: Layout, at: u8| [FIX, (layout.regions.len() - 1) as u8, at, 0, 0x01];
    // The footer's count of entries (events), one more: the file opens,
    // and fails to verify.
    let table_count = footer(Layout::of_table(&table_bytes), 0);
    let audit_count = footer(Layout::of_audit(&audit_bytes), 16);
    vec![
        ("table-raw".into(), raw(SIZE, table_bytes)),
        ("table-built".into(), built(SIZE, 16, &[], &entries)),
        ("table-classic-raw".into(), raw(SIZE, classic_bytes)),
        (
            "table-classic-built".into(),
            built(CLASSIC | SIZE, 16, &[], &entries),
        ),
        ("table-fixed-page".into(), built(0, 16, &[page], &entries)),
        (
            "table-fixed-footer-count".into(),
            built(0, 16, &[table_count], &entries),
        ),
        ("audit-raw".into(), raw(AUDIT | SIZE, audit_bytes)),
        ("audit-built".into(), built(AUDIT | SIZE, 1, &[], &events)),
        (
            "audit-fixed-chunk".into(),
            built(AUDIT, 1, &[page], &events),
        ),
        (
            "audit-fixed-footer-count".into(),
            built(AUDIT, 1, &[audit_count], &events),
        ),
    ]
}
