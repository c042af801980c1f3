//! The workers directory: where a worker whose journal has no directory of
//! its own (PostgreSQL, or a journal given to `RuntimeBuilder::journal`)
//! keeps its admin files, one subdirectory per worker id, so that the
//! `idem` CLI on the same machine finds it by its id (`idem --worker ID`).
//!
//! The directory is [`WORKERS_DIR_ENV`] when set, else
//! `$XDG_RUNTIME_DIR/idem/workers`, else `$HOME/.local/state/idem/workers`.
//! Every directory idem creates on the way is made with mode 0700; a
//! worker's own directory must be a real directory (not a symbolic link),
//! owned by the process's user and closed to everyone else, or it is
//! refused: it holds the bearer token.

use std::fs;
use std::path::{Path, PathBuf};

use idem_journal::error::Error;
use idem_journal::files as private_files;

/// The environment variable that, when set, is the workers directory.
pub const WORKERS_DIR_ENV: &str = "IDEM_WORKERS_DIR";

/// The workers directory of this process's user (see [the module](self)).
/// Not created here.
pub fn workers_dir() -> Result<PathBuf, Error> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = set(WORKERS_DIR_ENV) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(run) = set("XDG_RUNTIME_DIR") {
        return Ok(Path::new(&run).join("idem").join("workers"));
    }
    if let Some(home) = set("HOME") {
        return Ok(Path::new(&home).join(".local/state/idem/workers"));
    }
    Err(Error::Usage(format!(
        "where do this worker's admin files go? neither {WORKERS_DIR_ENV}, XDG_RUNTIME_DIR nor \
         HOME is set: set {WORKERS_DIR_ENV}, or give AdminOptions::dir(..)"
    )))
}

/// The directory of worker `id` in `workers` (its name is the id, with
/// every byte outside `A-Z a-z 0-9 - _ . @` and a leading `.` written as
/// `%XX`, so that no id names another place).
pub fn worker_dir(workers: &Path, id: &str) -> PathBuf {
    workers.join(encode(id))
}

/// Makes the directory of worker `id` (and the workers directory, when
/// missing) with mode 0700, and checks that it can be trusted with the
/// token. Returns its path.
pub fn ensure_worker_dir(workers: &Path, id: &str) -> Result<PathBuf, Error> {
    let dir = worker_dir(workers, id);
    let location = dir.display().to_string();
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
        .create(&dir)
        .map_err(|e| Error::storage("create the worker's admin directory", &location, e))?;
    private_files::check_ours(workers, "the workers directory", false)?;
    private_files::check_ours(&dir, "the worker's admin directory", true)?;
    Ok(dir)
}

/// The directory of worker `id` in `workers` if there is one, checked as
/// [`ensure_worker_dir`] checks it (a client reads the token there).
pub fn find_worker_dir(workers: &Path, id: &str) -> Result<Option<PathBuf>, Error> {
    let dir = worker_dir(workers, id);
    match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::storage(
            "inspect the worker's admin directory",
            &dir.display().to_string(),
            e,
        )),
        Ok(_) => {
            private_files::check_ours(&dir, "the worker's admin directory", true)?;
            Ok(Some(dir))
        }
    }
}

/// The workers found in `workers`, as `(id, directory)`, sorted by id.
/// A missing workers directory is an empty list.
pub fn list_workers(workers: &Path) -> Result<Vec<(String, PathBuf)>, Error> {
    let location = workers.display().to_string();
    let entries = match fs::read_dir(workers) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::storage("list the workers directory", &location, e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| Error::storage("list the workers directory", &location, e))?;
        let name = entry.file_name();
        // What idem did not name is not a worker of ours.
        let Some(id) = name.to_str().and_then(decode) else {
            continue;
        };
        if encode(&id) == *name.to_string_lossy() && entry.path().is_dir() {
            found.push((id, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@')
}

fn encode(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for (i, &b) in id.as_bytes().iter().enumerate() {
        if plain(b) && !(i == 0 && b == b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() {
        // An empty id still names a directory of its own.
        out.push('%');
    }
    out
}

fn decode(name: &str) -> Option<String> {
    if name == "%" {
        return Some(String::new());
    }
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_id_names_one_directory_inside_the_workers_directory() {
        for id in [
            "pod-7",
            "a/../../etc",
            "..",
            ".hidden",
            "",
            "ü b%",
            "w@host.example",
        ] {
            let name = encode(id);
            assert!(
                !name.contains('/') && name != "." && name != "..",
                "{id:?} -> {name}"
            );
            assert!(!name.starts_with('.'), "{id:?} -> {name}");
            assert_eq!(decode(&name).as_deref(), Some(id), "{id:?} -> {name}");
        }
        assert_eq!(encode("pod-7"), "pod-7");
        assert_ne!(encode("a%2Fb"), encode("a/b"));
    }

    #[test]
    fn a_worker_directory_is_made_private_and_listed_by_id() {
        let tmp = tempfile::tempdir().unwrap();
        let workers = tmp.path().join("w");
        let dir = ensure_worker_dir(&workers, "pod/7").unwrap();
        assert_eq!(dir, workers.join("pod%2F7"));
        for made in [&workers, &dir] {
            let mode = fs::metadata(made).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", made.display());
        }
        ensure_worker_dir(&workers, "pod-8").unwrap();
        fs::create_dir(workers.join("not%zzours")).unwrap();
        fs::write(workers.join("stray-file"), b"").unwrap();
        let ids: Vec<String> = list_workers(&workers)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, ["pod-8", "pod/7"]);
        assert!(list_workers(&tmp.path().join("none")).unwrap().is_empty());
    }

    #[test]
    fn a_worker_directory_others_can_enter_or_a_symlink_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let workers = tmp.path().join("w");
        let dir = ensure_worker_dir(&workers, "pod-7").unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).unwrap();
        let err = ensure_worker_dir(&workers, "pod-7").unwrap_err();
        assert!(err.to_string().contains("mode 750"), "{err}");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        // A planted link to somewhere else is not followed.
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, worker_dir(&workers, "pod-8")).unwrap();
        let err = ensure_worker_dir(&workers, "pod-8").unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        // A workers directory others can write to is refused too.
        fs::set_permissions(&workers, fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure_worker_dir(&workers, "pod-7").unwrap_err();
        assert!(err.to_string().contains("mode 777"), "{err}");
    }
}
