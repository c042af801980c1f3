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
    let written = (|| {
        let f = options().create(true).truncate(true).open(&tmp)?;
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
