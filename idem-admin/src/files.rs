//! The two files the admin API keeps in the journal directory: the bearer
//! token (`idem-admin-token`, mode 0600, made on first start) and where the
//! running process listens (`idem-admin-addr`), so that anything that knows
//! the journal directory finds the process.

use std::fs;
#[cfg(feature = "server")]
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use idem_journal::error::Error;
use idem_journal::files as private_files;

/// The token file's name in the journal directory.
pub const TOKEN_FILE: &str = "idem-admin-token";
/// The address file's name in the journal directory.
pub const ADDRESS_FILE: &str = "idem-admin-addr";
/// The environment variable that, when set, is the token (the file is then
/// neither read nor written).
pub const TOKEN_ENV: &str = "IDEM_ADMIN_TOKEN";

/// The token file of the journal in `dir`.
pub fn token_path(dir: &Path) -> PathBuf {
    dir.join(TOKEN_FILE)
}

/// The address file of the journal in `dir`.
pub fn address_path(dir: &Path) -> PathBuf {
    dir.join(ADDRESS_FILE)
}

/// What the address file holds (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressFile {
    /// The base URL to call, e.g. `http://127.0.0.1:43127`.
    pub url: String,
    /// The address the server is bound to.
    pub addr: std::net::SocketAddr,
    /// The serving process.
    pub pid: u32,
    /// A random id of this start of the server. A client asks the server
    /// to prove it holds the token for this address and this id
    /// ([`crate::proof`]) before it sends the token, so that whatever may
    /// listen on the port after the process died never receives it.
    pub instance: String,
}

impl AddressFile {
    /// Reads the address file in journal directory `dir`; `None` if there
    /// is none (no process serves the admin API, or it stopped cleanly).
    pub fn read(dir: &Path) -> Result<Option<AddressFile>, Error> {
        let path = address_path(dir);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                Error::storage(
                    "read the admin address file",
                    &path.display().to_string(),
                    e,
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::storage(
                "read the admin address file",
                &path.display().to_string(),
                e,
            )),
        }
    }

    /// Writes it atomically (a temporary file renamed over the old one):
    /// a reader sees the old address or the new one, never half of one.
    /// Writes the file (not durably: it only says where a running process
    /// listens).
    pub fn write(&self, dir: &Path) -> Result<(), Error> {
        let location = address_path(dir).display().to_string();
        let io = |e: std::io::Error| Error::storage("write the admin address file", &location, e);
        let bytes = serde_json::to_vec(self).map_err(|e| io(std::io::Error::other(e)))?;
        // Not durable: the file only says where a running process listens.
        private_files::replace(dir, ADDRESS_FILE, &[&bytes, b"\n"], false).map_err(io)
    }

    /// Removes the address file if it is still this one (a later start may
    /// have replaced it).
    /// Removes the file if it still names this instance.
    pub fn remove_if_ours(&self, dir: &Path) {
        if let Ok(Some(current)) = AddressFile::read(dir) {
            if current.instance == self.instance {
                if let Err(e) = fs::remove_file(address_path(dir)) {
                    tracing::warn!(target: "idem::admin", error = %e, "could not remove the admin address file");
                }
            }
        }
    }
}

/// The token: `IDEM_ADMIN_TOKEN` (or the one given), else the token file,
/// made on first start.
#[cfg(feature = "server")]
pub(crate) fn load_or_create_token(dir: &Path, given: Option<&str>) -> Result<String, Error> {
    if let Some(token) = given
        .map(str::to_string)
        .or_else(|| std::env::var(TOKEN_ENV).ok())
    {
        return check_token(token, TOKEN_ENV);
    }
    let path = token_path(dir);
    let location = path.display().to_string();
    let io = |e: std::io::Error| Error::storage("read the admin token", &location, e);
    match fs::read_to_string(&path) {
        Ok(text) => {
            private_files::check_ours(&path, "the admin token file", true)?;
            check_token(text.trim().to_string(), &location)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = new_token()?;
            // create_new: never replace a token someone already uses.
            let mut f = private_files::options()
                .create_new(true)
                .open(&path)
                .map_err(io)?;
            f.write_all(token.as_bytes()).map_err(io)?;
            f.write_all(b"\n").map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(token)
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(feature = "server")]
fn check_token(token: String, from: &str) -> Result<String, Error> {
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::Usage(format!(
            "the admin token from {from} contains whitespace; \
             use a long random string (the generated ones are 64 hex digits)"
        )));
    }
    if token.len() < MIN_TOKEN_BYTES {
        return Err(Error::Usage(format!(
            "the admin token from {from} is {} bytes long; it must be at least \
             {MIN_TOKEN_BYTES} (a short token is guessed): use a long random string \
             (the generated ones are 64 hex digits)",
            token.len()
        )));
    }
    Ok(token)
}

/// The shortest token the admin API accepts.
pub const MIN_TOKEN_BYTES: usize = 16;

/// 32 random bytes from the operating system, as hex.
#[cfg(feature = "server")]
fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::storage("generate the admin token", "getrandom", e))?;
    Ok(idem_journal::key::hex(&bytes))
}

/// Compares a presented token with the real one in time that does not
/// depend on where they differ.
#[cfg(feature = "server")]
pub(crate) fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    // The length is not secret (the generated ones are all 64 digits); the
    // contents are compared in full whatever the first difference.
    if presented.len() != expected.len() {
        return false;
    }
    let diff = presented
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(diff) == 0
}

#[cfg(all(test, feature = "server"))]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abd", b"abc"));
        assert!(!token_matches(b"ab", b"abc"));
        assert!(!token_matches(b"", b"abc"));
    }

    #[test]
    fn a_token_is_made_once_private_and_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create_token(dir.path(), None).unwrap();
        assert_eq!(first.len(), 64);
        assert_eq!(load_or_create_token(dir.path(), None).unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(token_path(dir.path()))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
            fs::set_permissions(token_path(dir.path()), fs::Permissions::from_mode(0o644)).unwrap();
            let err = load_or_create_token(dir.path(), None).unwrap_err();
            assert!(err.to_string().contains("mode 644"), "{err}");
            // Owned by another user (only root can give a file away; CI
            // runs as root): refused even at mode 0600.
            fs::set_permissions(token_path(dir.path()), fs::Permissions::from_mode(0o600)).unwrap();
            load_or_create_token(dir.path(), None).unwrap();
            if std::os::unix::fs::chown(token_path(dir.path()), Some(65534), None).is_ok() {
                let err = load_or_create_token(dir.path(), None).unwrap_err();
                assert!(err.to_string().contains("owned by user 65534"), "{err}");
            }
        }
    }

    #[test]
    fn a_given_token_is_used_as_is_and_no_file_is_written() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            load_or_create_token(dir.path(), Some("s3cret-s3cret-s3cret")).unwrap(),
            "s3cret-s3cret-s3cret"
        );
        assert!(!token_path(dir.path()).exists());
        assert!(load_or_create_token(dir.path(), Some("has space and is long enough")).is_err());
        assert!(load_or_create_token(dir.path(), Some("")).is_err());
        // Fifteen bytes: guessable, refused; sixteen are taken.
        let err = load_or_create_token(dir.path(), Some("0123456789abcde")).unwrap_err();
        assert!(err.to_string().contains("at least 16"), "{err}");
        load_or_create_token(dir.path(), Some("0123456789abcdef")).unwrap();
    }
}
