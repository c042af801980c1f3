//! [`AdminOptions`]: how the admin API is served.

use std::path::{Path, PathBuf};

/// How the admin API is served; see `RuntimeBuilder::admin_with`.
#[derive(Clone)]
pub struct AdminOptions {
    pub(crate) addr: String,
    pub(crate) token: Option<String>,
    pub(crate) allow_remote: bool,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) public_metrics: bool,
}

impl std::fmt::Debug for AdminOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminOptions")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("allow_remote", &self.allow_remote)
            .field("dir", &self.dir)
            .field("public_metrics", &self.public_metrics)
            .finish()
    }
}

impl AdminOptions {
    /// Serve on `addr` (`"127.0.0.1:0"`: any free port on loopback).
    pub fn new(addr: impl Into<String>) -> AdminOptions {
        AdminOptions {
            addr: addr.into(),
            token: None,
            allow_remote: false,
            dir: None,
            public_metrics: false,
        }
    }

    /// Use this token instead of [`TOKEN_ENV`](crate::files::TOKEN_ENV) or the token file (which is
    /// then neither read nor written).
    pub fn token(mut self, token: impl Into<String>) -> AdminOptions {
        self.token = Some(token.into());
        self
    }

    /// Allow an address that is not loopback. The API speaks plain HTTP:
    /// put TLS in front of it.
    pub fn allow_remote(mut self, allow: bool) -> AdminOptions {
        self.allow_remote = allow;
        self
    }

    /// Serve `GET /metrics` (Prometheus' text format) without the bearer
    /// token, for a scraper that cannot send one (default: the token is
    /// needed there as on every other route but `/healthz`). The metrics
    /// name tools and count calls; they carry no key, argument or result.
    pub fn public_metrics(mut self, public: bool) -> AdminOptions {
        self.public_metrics = public;
        self
    }

    /// Where the token and address files go (default: the journal
    /// directory given to `RuntimeBuilder::path`, else the worker's own
    /// directory in the [workers directory](crate::workers)).
    pub fn dir(mut self, dir: impl AsRef<Path>) -> AdminOptions {
        self.dir = Some(dir.as_ref().to_path_buf());
        self
    }
}

impl AdminOptions {
    /// Where the token and address files go: [`AdminOptions::dir`], else
    /// the journal's directory when it has one, else the directory of
    /// worker `worker_id` in the [workers directory](crate::workers)
    /// (created with mode 0700; a PostgreSQL worker's usual place).
    pub fn files_dir(
        &self,
        journal_dir: Option<&Path>,
        worker_id: &str,
    ) -> Result<PathBuf, idem_journal::error::Error> {
        if let Some(dir) = self
            .dir
            .clone()
            .or_else(|| journal_dir.map(Path::to_path_buf))
        {
            return Ok(dir);
        }
        crate::workers::ensure_worker_dir(&crate::workers::workers_dir()?, worker_id)
    }
}
