//! Files only their owner can read or write. The journal holds every
//! call's arguments and the admin API's token is a credential, so both are
//! created mode 0600 (directories 0700 elsewhere), as PostgreSQL insists for
//! its data directory.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;

/// Options for a new file only its owner may read, opened for writing.
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o.write(true);
    o
}

/// fsyncs a directory, so that the entries created, renamed or removed in
/// it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces `dir/name` with `parts` atomically: the contents go to a
/// temporary file renamed over the old one, so a reader sees the old file
/// or the new one, never half of one. `durable` also fsyncs the file before
/// the rename and the directory after it, so that the new contents survive
/// a power cut once this returns.
pub fn replace(dir: &Path, name: &str, parts: &[&[u8]], durable: bool) -> io::Result<()> {
    replace_with(dir, name, durable, |f| {
        for part in parts {
            f.write_all(part)?;
        }
        Ok(())
    })
}

/// [`replace`] with contents written by `fill` (through a buffer), for a
/// file too large to assemble in memory first. If `fill` fails, the
/// temporary file is removed and the old file stays.
pub fn replace_with(
    dir: &Path,
    name: &str,
    durable: bool,
    fill: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    // A stale temporary file (a crash between create and rename), or
    // something planted in its place, is removed first (a symlink is
    // removed, never followed); the new one is created exclusively, so an
    // entry that appears in between makes this fail instead of being
    // written through.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let written = (|| {
        let f = options().create_new(true).open(&tmp)?;
        let mut w = io::BufWriter::with_capacity(1 << 20, f);
        fill(&mut w)?;
        let f = w.into_inner().map_err(io::IntoInnerError::into_error)?;
        if durable {
            f.sync_all()?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, dir.join(name))?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Why a file or directory in the journal directory is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {path} {why}")]
pub struct Untrusted {
    /// What it is ("the journal directory", "the admin token file").
    pub what: &'static str,
    /// Where.
    pub path: String,
    /// What is wrong, and what to do.
    pub why: String,
}

/// Checks that `path` is ours: owned by the effective user and not
/// writable by group or others, as PostgreSQL checks its data directory;
/// a `secret` (the token file) is also not readable by them and is never
/// reached through a symbolic link, as ssh checks its keys. A directory
/// may be a symbolic link (a data directory moved to another disk): what
/// it points to is judged.
pub fn check_ours(path: &Path, what: &'static str, secret: bool) -> Result<(), Untrusted> {
    let untrusted = |why: String| Untrusted {
        what,
        path: path.display().to_string(),
        why,
    };
    let inspect = |e: io::Error| untrusted(format!("cannot be inspected: {e}"));
    let meta = if secret {
        let meta = fs::symlink_metadata(path).map_err(inspect)?;
        if meta.file_type().is_symlink() {
            return Err(untrusted(
                "is a symbolic link; refusing to follow it".into(),
            ));
        }
        meta
    } else {
        fs::metadata(path).map_err(inspect)?
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(untrusted(format!(
                "is owned by user {}, not by this process's user {me}; refusing to trust it \
                 (chown it, or run as its owner)",
                meta.uid()
            )));
        }
        let mode = meta.mode() & 0o777;
        let forbidden = if secret { 0o077 } else { 0o022 };
        if mode & forbidden != 0 {
            return Err(untrusted(format!(
                "has mode {mode:o}: other users {} it; refusing to trust it (`chmod {}` it)",
                if secret {
                    "may have read or changed"
                } else {
                    "can change what is in"
                },
                if secret { "600" } else { "700" }
            )));
        }
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_symlink_planted_as_the_temporary_file_is_removed_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("addr.tmp")).unwrap();
        replace(dir.path(), "addr", &[b"new"], false).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert_eq!(fs::read(dir.path().join("addr")).unwrap(), b"new");
        assert!(!dir.path().join("addr.tmp").exists());
    }

    #[test]
    fn only_our_own_unshared_entries_are_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("j");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        check_ours(&d, "the journal directory", false).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_ours(&d, "the journal directory", false).unwrap_err();
        assert!(e.why.contains("mode 777"), "{e}");
        // A directory reached through a symlink is judged by its target.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = check_ours(&link, "the journal directory", false).unwrap_err();
        assert!(e.why.contains("mode 777"), "{e}");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        check_ours(&link, "the journal directory", false).unwrap();
        let token = dir.path().join("token");
        fs::write(&token, b"t").unwrap();
        fs::set_permissions(&token, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(check_ours(&token, "the admin token file", true).is_err());
        fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
        check_ours(&token, "the admin token file", true).unwrap();
        // A secret is never read through a symlink, even to a good file.
        let token_link = dir.path().join("token-link");
        std::os::unix::fs::symlink(&token, &token_link).unwrap();
        let e = check_ours(&token_link, "the admin token file", true).unwrap_err();
        assert!(e.why.contains("symbolic link"), "{e}");
    }

    #[test]
    fn an_entry_owned_by_another_user_is_refused() {
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // Only root can give a file away; CI runs as root.
            eprintln!("not root: cannot make a file another user's, nothing to check");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        fs::write(&token, b"t").unwrap();
        fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&token, Some(65534), Some(65534)).unwrap();
        let e = check_ours(&token, "the admin token file", true).unwrap_err();
        assert!(e.why.contains("owned by user 65534"), "{e}");
    }
}
