//! Opening a journal reads every page of sled (the content check), and
//! sled 0.34's cache counts page accesses in batches of 64 per shard: after
//! one pass, most pages would stay in memory uncounted, whatever
//! `cache_capacity` says. The open closes sled and opens it again once it
//! is checked and durable. This test counts the heap the open leaves
//! behind. It is alone in its binary: the count is the whole process's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use idem_journal::journal::{
    ClaimChange, Durability, Expect, Journal, NewEvent, Space, Write, Written,
};
use idem_sled::{SledJournal, SledOptions};

/// The system allocator, counting the bytes it has handed out and not
/// yet been given back.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const RECORDS: u32 = 20_000;
const BODY: usize = 400;

/// Keys spread over the whole key space, as hashed operation keys are.
fn key(i: u32) -> [u8; 32] {
    let mut x = u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut key = [0u8; 32];
    for chunk in key.chunks_mut(8) {
        x ^= x >> 29;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    key
}

#[test]
fn an_open_keeps_no_more_of_sled_in_memory_than_its_cache() {
    let dir = tempfile::TempDir::new().unwrap();
    let options = SledOptions {
        cache_capacity: 1 << 20,
        ..SledOptions::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    {
        let j = SledJournal::open_with(dir.path(), &options).unwrap();
        rt.block_on(async {
            for i in 0..RECORDS {
                let key = key(i);
                let body = vec![i as u8; BODY];
                let ev = i.to_le_bytes();
                let events = [NewEvent {
                    key: Some(&key),
                    bytes: &ev,
                }];
                let w = Write {
                    space: Space::Ops,
                    key: &key,
                    expect: Expect::Absent,
                    body: &body,
                    claim: ClaimChange::Keep,
                    escalated: false,
                    events: &events,
                    durability: Durability::Eventual,
                };
                assert!(matches!(j.write(w).await.unwrap(), Written::Done { .. }));
            }
            j.sync().await.unwrap();
        });
    }
    // What an open holds whatever the journal's size (buffers, sled's own
    // structures): an empty journal's.
    let empty = tempfile::TempDir::new().unwrap();
    drop(SledJournal::open_with(empty.path(), &options).unwrap());
    let before = LIVE.load(Ordering::Relaxed);
    let e = SledJournal::open_with(empty.path(), &options).unwrap();
    let baseline = LIVE.load(Ordering::Relaxed) - before;
    drop(e);

    let content = RECORDS as isize * (BODY + 32) as isize;
    let before = LIVE.load(Ordering::Relaxed);
    let j = SledJournal::open_with(dir.path(), &options).unwrap();
    let held = LIVE.load(Ordering::Relaxed) - before - baseline;
    assert!(
        held < content / 4,
        "the open holds {held} bytes of heap beyond an empty journal's {baseline}, for {content} \
         bytes of records (cache: 1 MiB)"
    );
    // Everything is still there.
    rt.block_on(async {
        for i in (0..RECORDS).step_by(997) {
            let got = j.load(Space::Ops, &key(i)).await.unwrap().unwrap();
            assert_eq!(got.body, vec![i as u8; BODY]);
        }
    });
}
