//! What every fuzz target shares: an allocator that measures how much the
//! code under test allocates, so that "never allocate without bound" is a
//! property the fuzzer checks, not only a memory limit that a big enough
//! allocation happens to cross.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts live bytes and their high-water mark.
struct Metered;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Metered {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        q
    }
}

fn grew(n: usize) {
    let live = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

#[global_allocator]
static ALLOC: Metered = Metered;

/// Most that one input of `len` bytes may make a target allocate at once:
/// linear in the input (the targets copy it a few times and decoded values
/// are a few times their encoding) plus a constant: serde preallocates up
/// to 1 MiB for a sequence whose length prefix is larger than that (its
/// "cautious" size hint), and bincode may claim up to 64 KiB for a string
/// of a small frame before finding it missing.
pub fn allowed(len: usize) -> usize {
    64 * len + (4 << 20)
}

/// Runs a target on `data` and panics if it allocated more than
/// [`allowed`] beyond what was live before.
pub fn bounded<T>(data: &[u8], target: fn(&[u8]) -> T) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    target(data);
    let used = PEAK.load(Ordering::Relaxed) - before;
    assert!(
        used <= allowed(data.len()),
        "{used} bytes allocated at once for a {}-byte input (allowed {})",
        data.len(),
        allowed(data.len())
    );
}
