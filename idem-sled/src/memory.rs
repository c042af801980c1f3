//! Handing freed memory back to the system.
//!
//! Opening a journal reads every entry of sled (the content check), and
//! sled's cache and a checkpoint's batches come and go in large numbers of
//! small allocations. glibc's allocator keeps what they free in its heaps
//! for reuse: after the open of a journal of 300,000 operations, about
//! 250 MiB of the process's resident memory was freed memory it held, and
//! it held it after the journal closed. [`release`] asks it to return that
//! memory (`malloc_trim(0)`, which also gives back free pages inside its
//! heaps, not only at their tops). Elsewhere it does nothing: other
//! allocators return memory on their own terms.

/// Returns the memory glibc's allocator holds freed, in every arena, to
/// the system. Called when a journal has opened (or been converted) and
/// when it closes: moments after which what was freed is not soon needed
/// again. Checkpoints and merges go through [`Releases`].
pub(super) fn release() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointer and only changes which of
        // the allocator's free pages stay mapped; it is safe to call from
        // any thread at any time.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Background passes (checkpoints, merges) between two releases while the
/// journal is busy.
pub(super) const RELEASE_EVERY: u32 = 8;

/// When a checkpoint or a merge gives back what it freed.
///
/// Each one frees megabytes (the segment it read, the folded records, the
/// pages it compressed), and under a steady load the next one needs as
/// much again. A release after each of them unmapped those pages only for
/// the next to fault them back in, and its `madvise` calls interrupted the
/// callers' threads to flush their TLBs: 64 tasks writing a million
/// operations made about 5 % fewer calls a second (alternated runs,
/// 45,190-48,047/s against 48,227-50,865/s). So while writes keep coming, every
/// [`RELEASE_EVERY`]th pass releases; a pass during which little was
/// logged releases at once, so a journal whose load has ebbed holds no
/// more than it needs after its next pass. The closing release is
/// unconditional (see `SledJournal`).
#[derive(Debug, Default)]
pub(super) struct Releases {
    since: std::sync::atomic::AtomicU32,
}

impl Releases {
    /// Called at the end of a checkpoint or merge; `quiet` says whether
    /// little was logged meanwhile. Returns whether it released.
    pub(super) fn after_pass(&self, quiet: bool) -> bool {
        use std::sync::atomic::Ordering;
        let passes = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        if !quiet && passes < RELEASE_EVERY {
            return false;
        }
        self.since.store(0, Ordering::Relaxed);
        release();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_journal_releases_every_eighth_pass_and_a_quiet_one_at_once() {
        let r = Releases::default();
        let busy: Vec<bool> = (0..2 * RELEASE_EVERY)
            .map(|_| r.after_pass(false))
            .collect();
        let mut expected = vec![false; 2 * RELEASE_EVERY as usize];
        expected[RELEASE_EVERY as usize - 1] = true;
        expected[2 * RELEASE_EVERY as usize - 1] = true;
        assert_eq!(busy, expected);
        // Three busy passes, then a quiet one releases and starts the count
        // again.
        assert!(!r.after_pass(false) && !r.after_pass(false) && !r.after_pass(false));
        assert!(r.after_pass(true));
        let next: Vec<bool> = (0..RELEASE_EVERY).map(|_| r.after_pass(false)).collect();
        assert_eq!(next.iter().filter(|&&b| b).count(), 1);
        assert!(next[RELEASE_EVERY as usize - 1]);
    }
}
