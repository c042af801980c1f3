//! The admin API (feature `admin`): a running process serves its journal to
//! operators over HTTP, so that nobody has to stop the agent to settle an
//! escalation.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_runtime::Error> {
//! use idem_runtime::Runtime;
//!
//! // Inside a tokio runtime: the server runs on it.
//! let rt = Runtime::builder()
//!     .path("./idem-journal")
//!     .admin("127.0.0.1:0") // any free port on loopback
//!     .open()?;
//! println!("operators: {}", rt.admin_url().unwrap_or_default());
//! # Ok(())
//! # }
//! ```
//!
//! # Routes
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/tools` | the program's tools ([`ToolInfo`]), each with its latest committed result as an example of its result's shape |
//! | `GET /v1/escalations` | every parked operation, oldest first ([`Escalation`](crate::Escalation)) |
//! | `GET /v1/ops/{key}` | one operation and its whole audit history ([`OperationView`]) |
//! | `POST /v1/ops/{key}/resolve` | settles it through [`Runtime::resolve`](crate::Runtime::resolve) ([`ResolveRequest`] in, [`Resolved`] out) |
//! | `GET /v1/audit?from=N` | the durable audit stream from `N` (or `end`) as JSON lines; `&limit=M` stops after `M`; `&follow=true` keeps streaming events as they become durable |
//! | `POST /v1/prune` | [`Runtime::prune`](crate::Runtime::prune) ([`PruneView`]) |
//! | `GET /v1/stats` | per-tool counts and the journal's size ([`StatsView`]) |
//! | `GET /healthz` | `{"status":"ok","instance":…}`, without a token |
//! | `GET /` | the escalation inbox, a page for people (it asks for the token) |
//!
//! Every `/v1/` route needs `Authorization: Bearer TOKEN`. The token is
//! [`TOKEN_ENV`] when set (or [`AdminOptions::token`]), else the contents of
//! [`TOKEN_FILE`] in the journal directory, generated on first start (32
//! random bytes as hex, mode 0600; a token file others can read is refused).
//! Errors are a 4xx or 5xx status with an [`ApiError`] body that says what
//! was wrong; a refused request writes nothing.
//!
//! The server writes [`ADDRESS_FILE`] ([`AddressFile`]) beside the token once
//! it listens, so that tools that know the journal directory (the `idem`
//! CLI) find the process; it removes the file when it stops. It stops when
//! the last `Runtime` handle (and every `Ctx`) is dropped: it holds no
//! reference that would keep the journal open.
//!
//! It listens on loopback unless [`AdminOptions::allow_remote`] says
//! otherwise: plain HTTP, no TLS.

mod body;
mod files;
mod follow;
mod inbox;
mod routes;
mod server;
mod wire;

use std::path::{Path, PathBuf};

pub use files::{address_path, token_path, AddressFile, ADDRESS_FILE, TOKEN_ENV, TOKEN_FILE};
pub use wire::{
    ApiError, ExampleResult, OperationView, PruneView, ResolveRequest, Resolved, RetryInfo,
    StatsView, ToolInfo,
};

pub(crate) use server::{require_tokio, start, Running};

use crate::runtime::{Runtime, RuntimeBuilder};

/// How the admin API is served; see [`RuntimeBuilder::admin_with`].
#[derive(Clone)]
pub struct AdminOptions {
    pub(crate) addr: String,
    pub(crate) token: Option<String>,
    pub(crate) allow_remote: bool,
    pub(crate) dir: Option<PathBuf>,
}

impl std::fmt::Debug for AdminOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminOptions")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("allow_remote", &self.allow_remote)
            .field("dir", &self.dir)
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
        }
    }

    /// Use this token instead of [`TOKEN_ENV`] or the token file (which is
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

    /// Where the token and address files go (default: the journal
    /// directory given to [`RuntimeBuilder::path`]); needed with
    /// [`RuntimeBuilder::journal`].
    pub fn dir(mut self, dir: impl AsRef<Path>) -> AdminOptions {
        self.dir = Some(dir.as_ref().to_path_buf());
        self
    }
}

impl RuntimeBuilder {
    /// Serves the admin API on `addr` once the runtime is open (feature
    /// `admin`; see [the module](crate::admin)). `open()` must then be
    /// called inside a tokio runtime, which serves it; it fails with
    /// [`Error::Usage`](crate::Error::Usage) otherwise, before touching the
    /// journal.
    pub fn admin(self, addr: impl Into<String>) -> RuntimeBuilder {
        self.admin_with(AdminOptions::new(addr))
    }

    /// [`RuntimeBuilder::admin`] with options.
    pub fn admin_with(mut self, options: AdminOptions) -> RuntimeBuilder {
        self.admin = Some(options);
        self
    }
}

impl Runtime {
    /// The admin API's base URL (`http://127.0.0.1:PORT`), if this runtime
    /// serves it.
    pub fn admin_url(&self) -> Option<String> {
        self.admin_running(|r| r.url.clone())
    }

    /// The address the admin API is bound to, if this runtime serves it.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin_running(|r| r.addr)
    }

    fn admin_running<T>(&self, f: impl FnOnce(&Running) -> T) -> Option<T> {
        let running = self.shared.admin.lock().unwrap_or_else(|p| p.into_inner());
        running.as_ref().map(f)
    }
}

/// Where the admin files go, checked before the journal is opened.
pub(crate) fn files_dir(
    options: &AdminOptions,
    path: Option<&Path>,
) -> Result<PathBuf, crate::Error> {
    options
        .dir
        .clone()
        .or_else(|| path.map(Path::to_path_buf))
        .ok_or_else(|| {
            crate::Error::Usage(
                "admin(..) with .journal(..) needs AdminOptions::dir(..): where the token and \
                 address files go"
                    .into(),
            )
        })
}
