//! A throwaway pgbouncer in front of a [`PgServer`], in transaction pooling
//! mode, for the tests of the PostgreSQL journal behind a connection
//! pooler: Debian's `pgbouncer` binary, a config file in a fresh temporary
//! directory, trust authentication, listening on 127.0.0.1 on a free port,
//! talking to the server over its unix socket.
//!
//! pgbouncer refuses to run as root, so as root it is started with
//! `-u postgres` (the user that runs the test server), which owns the
//! directory. It is killed and its directory removed when its [`PgBouncer`]
//! is dropped; should the process be killed outright, a watchdog shell (as
//! for the server) kills it as soon as the process is gone.

use std::io;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::pg::PgServer;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// How to run a pooler.
#[derive(Debug, Clone)]
pub struct PgBouncerOptions {
    /// `pool_mode` (default `transaction`).
    pub pool_mode: &'static str,
    /// `default_pool_size`: server connections per database and user
    /// (default 4: fewer than the clients, so that transactions of
    /// different clients really share sessions).
    pub pool_size: u32,
}

impl Default for PgBouncerOptions {
    fn default() -> Self {
        PgBouncerOptions {
            pool_mode: "transaction",
            pool_size: 4,
        }
    }
}

/// A running pgbouncer; see the module documentation.
#[derive(Debug)]
pub struct PgBouncer {
    root: PathBuf,
    port: u16,
    child: Child,
    watchdog: Child,
}

/// The pgbouncer binary: `IDEM_PGBOUNCER`, else `/usr/sbin/pgbouncer`, else
/// `pgbouncer` on the `PATH`.
pub fn binary() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("IDEM_PGBOUNCER") {
        return Ok(PathBuf::from(path));
    }
    let debian = PathBuf::from("/usr/sbin/pgbouncer");
    if debian.exists() {
        return Ok(debian);
    }
    let found = Command::new("sh")
        .args(["-c", "command -v pgbouncer"])
        .output()?;
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    if found.status.success() && !path.is_empty() {
        return Ok(PathBuf::from(path));
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "pgbouncer not found: install Debian's `pgbouncer` package (apt-get install -y \
         pgbouncer) or set IDEM_PGBOUNCER to the binary",
    ))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl PgBouncer {
    /// A pooler in transaction mode in front of every database of `server`.
    pub fn start(server: &PgServer) -> io::Result<PgBouncer> {
        PgBouncer::start_with(server, &PgBouncerOptions::default())
    }

    /// A pooler in front of every database of `server`.
    pub fn start_with(server: &PgServer, options: &PgBouncerOptions) -> io::Result<PgBouncer> {
        let bin = binary()?;
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let root = std::env::temp_dir().join(format!("idem-pgbouncer-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        // A free port: bound and released (another process could take it
        // in between; pgbouncer then fails to start, loudly).
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let server_port = server
            .url("x")
            .rsplit_once("port=")
            .map(|(_, p)| p.to_string())
            .unwrap_or_else(|| "5432".into());
        let conf = format!(
            "[databases]\n* = host={socket} port={server_port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {root}/users.txt\npool_mode = {mode}\n\
             default_pool_size = {size}\nmax_client_conn = 1000\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {root}/pgbouncer.log\nserver_login_retry = 1\n",
            socket = server.socket_dir().display(),
            root = root.display(),
            mode = options.pool_mode,
            size = options.pool_size,
        );
        std::fs::write(root.join("pgbouncer.ini"), conf)?;
        std::fs::write(root.join("users.txt"), "\"postgres\" \"\"\n")?;
        let mut cmd = Command::new(bin);
        if is_root() {
            let out = Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(&root)
                .output()?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "chown the pooler's directory: {}",
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            cmd.args(["-u", "postgres"]);
        }
        // Its stderr goes to a file, never to a pipe: pgbouncer also logs
        // every refused login there, and once a pipe nobody reads is full
        // (a database restart's burst of "server login has been failing"
        // does it), its writes block and the pooler stops serving anyone.
        let stderr = std::fs::File::create(root.join("stderr.txt"))?;
        let child = cmd
            .arg(root.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()?;
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; kill -9 {child} 2>/dev/null; \
             rm -rf '{root}'",
            pid = std::process::id(),
            child = child.id(),
            root = root.display(),
        );
        use std::os::unix::process::CommandExt as _;
        let watchdog = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let mut bouncer = PgBouncer {
            root,
            port,
            child,
            watchdog,
        };
        bouncer.wait_listening()?;
        Ok(bouncer)
    }

    /// Waits (at most 20 s) until the port accepts connections; an exit of
    /// pgbouncer before that is an error with its log.
    fn wait_listening(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait()? {
                let stderr =
                    std::fs::read_to_string(self.root.join("stderr.txt")).unwrap_or_default();
                return Err(io::Error::other(format!(
                    "pgbouncer exited ({status}): {stderr}{}",
                    self.log()
                )));
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "pgbouncer did not listen on 127.0.0.1:{} within 20 s: {}",
                    self.port,
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db` through the pooler (user `postgres`).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The URL through the pooler of a database whose direct URL
    /// [`PgServer::url`] (or [`PgServer::create_database`]) made.
    pub fn url_of(&self, direct: &str) -> String {
        self.url(PgServer::database_of(direct))
    }

    /// What pgbouncer logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

static SHARED: std::sync::OnceLock<PgBouncer> = std::sync::OnceLock::new();

extern "C" fn stop_shared_at_exit() {
    if let Some(bouncer) = SHARED.get() {
        bouncer.shut_down();
    }
}

impl PgBouncer {
    /// The pooler (transaction mode) in front of [`PgServer::shared`] that
    /// every test of this process shares; started on first use, killed
    /// when the process exits.
    ///
    /// # Panics
    /// If it cannot be started (pgbouncer or PostgreSQL is not installed):
    /// a test that needs it must fail, loudly, rather than skip.
    pub fn shared() -> &'static PgBouncer {
        SHARED.get_or_init(|| {
            let bouncer = PgBouncer::start(PgServer::shared()).unwrap_or_else(|e| panic!("{e}"));
            // SAFETY: registers a plain function with no preconditions.
            unsafe {
                libc::atexit(stop_shared_at_exit);
            }
            bouncer
        })
    }

    /// Kills pgbouncer and its watchdog (a shared one, at exit, is never
    /// dropped).
    fn shut_down(&self) {
        for pid in [self.child.id(), self.watchdog.id()] {
            // SAFETY: kill has no memory preconditions; the pids are our
            // own children, not yet reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The PostgreSQL journal through [`PgBouncer::shared`] in transaction
/// pooling mode, with [`PostgresOptions::pooler`](idem_runtime::PostgresOptions::pooler())
/// on: a fresh database of [`PgServer::shared`], every worker connecting
/// through the pooler on its own, as a process would. Leases last 30 s
/// unless a case asks otherwise.
#[cfg(feature = "postgres")]
pub struct Pooled {
    url: String,
}

/// [`Pooled`]: the conformance suite's backend behind pgbouncer.
#[cfg(feature = "postgres")]
pub async fn pooled() -> Box<dyn crate::conformance::Backend> {
    let direct = PgServer::shared()
        .create_database()
        .expect("create a test database");
    Box::new(Pooled {
        url: PgBouncer::shared().url_of(&direct),
    })
}

#[cfg(feature = "postgres")]
impl crate::conformance::Backend for Pooled {
    fn name(&self) -> &'static str {
        "postgres behind pgbouncer"
    }

    fn leases(&self) -> bool {
        true
    }

    fn open(
        &self,
    ) -> idem_runtime::journal::BoxFuture<'_, std::sync::Arc<dyn idem_runtime::journal::Journal>>
    {
        self.open_with_lease(Duration::from_secs(30))
    }

    fn open_with_lease(
        &self,
        lease: Duration,
    ) -> idem_runtime::journal::BoxFuture<'_, std::sync::Arc<dyn idem_runtime::journal::Journal>>
    {
        Box::pin(async move {
            let options = idem_runtime::PostgresOptions {
                lease,
                pool_size: 8,
                ..idem_runtime::PostgresOptions::default()
            }
            .pooler(true);
            let j = idem_runtime::PostgresJournal::connect_with(&self.url, &options)
                .await
                .expect("connect to the test database through pgbouncer");
            std::sync::Arc::new(j) as std::sync::Arc<dyn idem_runtime::journal::Journal>
        })
    }

    fn crash(&self) -> idem_runtime::journal::BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}
