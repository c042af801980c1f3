//! The tools of the journals kept under `tests/fixtures/` (the programs
//! beside them define the same names and keys), a count of their calls,
//! and a copy of a fixture that a test may change.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use idem::{tool, Classify, Ctx, Failure};

/// Calls of the tools below: a replay from the journal makes none.
pub static CALLS: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
pub struct E(pub bool);

impl std::fmt::Display for E {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0 {
            "timed out after sending"
        } else {
            "declined"
        })
    }
}

impl Classify for E {
    fn classify(&self) -> Failure {
        if self.0 {
            Failure::Ambiguous { retry_after: None }
        } else {
            Failure::Semantic
        }
    }
}

/// Answers otherwise than the fixtures' program did ("again"), so that a
/// call where a replay was due shows in the result too.
#[tool(class = "provider", key = "n")]
pub async fn charge(ctx: &Ctx, n: u64) -> Result<String, E> {
    let _ = ctx;
    CALLS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("ch_{n:06} again"))
}

#[tool(class = "at_most_once", key = "n")]
pub async fn wire(ctx: &Ctx, n: u64) -> Result<String, E> {
    let _ = (ctx, n);
    CALLS.fetch_add(1, Ordering::SeqCst);
    Err(E(true))
}

/// Copies a fixture as a journal directory of ours (0700, files 0600).
pub fn copy_dir(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to).unwrap();
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700)).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
}
