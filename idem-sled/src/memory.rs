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

/// Growth of the process's resident memory since the last release past
/// which a busy pass releases without waiting for its turn: what the
/// allocator holds freed between two releases stays within about this
/// much (two default segments).
pub(super) const GROWTH: u64 = 16 << 20;

/// The process's resident memory in bytes (`/proc/self/statm`), where
/// [`release`] does anything; `None` elsewhere or if it cannot be read.
fn resident() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: sysconf only reads a system constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(page).ok().map(|page| pages * page)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

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
/// more than it needs after its next pass; and a busy pass that finds the
/// process's resident memory grown by more than [`GROWTH`] since the last
/// release releases without waiting for its turn, so what is held freed
/// stays bounded however large the passes get. The closing release is
/// unconditional (see `SledJournal`).
#[derive(Debug, Default)]
pub(super) struct Releases {
    since: std::sync::atomic::AtomicU32,
    /// Resident bytes just after the last release; 0 until the first pass.
    floor: std::sync::atomic::AtomicU64,
}

impl Releases {
    /// Called at the end of a checkpoint or merge; `quiet` says whether
    /// little was logged meanwhile. Returns whether it released.
    pub(super) fn after_pass(&self, quiet: bool) -> bool {
        if !self.due(quiet, resident()) {
            return false;
        }
        release();
        self.released(resident());
        true
    }

    /// Whether a pass that ended with `resident` bytes resident (if known)
    /// should release; counts the pass.
    fn due(&self, quiet: bool, resident: Option<u64>) -> bool {
        use std::sync::atomic::Ordering;
        let passes = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        let grown = resident.is_some_and(|now| {
            match self.floor.load(Ordering::Relaxed) {
                // The first pass: where memory stands is the floor.
                0 => {
                    self.floor.store(now.max(1), Ordering::Relaxed);
                    false
                }
                floor => now > floor.saturating_add(GROWTH),
            }
        });
        quiet || grown || passes >= RELEASE_EVERY
    }

    /// A release happened, after which `resident` bytes were resident.
    fn released(&self, resident: Option<u64>) {
        use std::sync::atomic::Ordering;
        self.since.store(0, Ordering::Relaxed);
        if let Some(now) = resident {
            self.floor.store(now.max(1), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_journal_releases_every_eighth_pass_and_a_quiet_one_at_once() {
        // Without a resident figure: the count and quiet passes alone.
        let r = Releases::default();
        let pass = |quiet| {
            let due = r.due(quiet, None);
            if due {
                r.released(None);
            }
            due
        };
        let busy: Vec<bool> = (0..2 * RELEASE_EVERY).map(|_| pass(false)).collect();
        let mut expected = vec![false; 2 * RELEASE_EVERY as usize];
        expected[RELEASE_EVERY as usize - 1] = true;
        expected[2 * RELEASE_EVERY as usize - 1] = true;
        assert_eq!(busy, expected);
        // Three busy passes, then a quiet one releases and starts the count
        // again.
        assert!(!pass(false) && !pass(false) && !pass(false));
        assert!(pass(true));
        let next: Vec<bool> = (0..RELEASE_EVERY).map(|_| pass(false)).collect();
        assert_eq!(next.iter().filter(|&&b| b).count(), 1);
        assert!(next[RELEASE_EVERY as usize - 1]);
    }

    #[test]
    fn a_busy_pass_releases_early_once_resident_memory_grew_past_the_allowance() {
        const MIB: u64 = 1 << 20;
        let r = Releases::default();
        // The first pass sets the floor, whatever it finds.
        assert!(!r.due(false, Some(500 * MIB)));
        assert!(!r.due(false, Some(500 * MIB + GROWTH)), "at the allowance");
        assert!(r.due(false, Some(500 * MIB + GROWTH + 1)), "past it");
        // After the release, the floor is where memory came back to: the
        // same figure is no longer growth, and the count starts again.
        r.released(Some(480 * MIB));
        assert!(!r.due(false, Some(480 * MIB + GROWTH)));
        assert!(r.due(false, Some(481 * MIB + GROWTH)));
        // Unknown resident memory: only the count and quiet passes.
        r.released(None);
        let passes: Vec<bool> = (0..RELEASE_EVERY).map(|_| r.due(false, None)).collect();
        assert_eq!(passes.iter().filter(|&&b| b).count(), 1);
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_release_starts_the_count_again_from_where_memory_came_back_to() {
        use std::sync::atomic::Ordering;
        let r = Releases::default();
        assert!(
            !r.after_pass(false),
            "the first busy pass only sets the floor"
        );
        assert!(r.after_pass(true), "a quiet pass releases");
        assert_eq!(r.since.load(Ordering::Relaxed), 0);
        let floor = r.floor.load(Ordering::Relaxed);
        assert!(
            floor > 1,
            "the floor is this process's resident memory: {floor}"
        );
    }
}
