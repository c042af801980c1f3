//! A throwaway PostgreSQL server for tests, the torture harness and the
//! benchmark: Debian's `postgresql` binaries, a data directory and a unix
//! socket in a fresh temporary directory, trust authentication, no TCP.
//!
//! `initdb` refuses to run as root, so as root every server command runs as
//! the `postgres` system user (`runuser`), which owns the directories.
//! A server is stopped (`pg_ctl stop -m immediate`) and its directory
//! removed when its [`PgServer`] is dropped; [`PgServer::shared`] (one per
//! process, for tests that only need a database each) is stopped when the
//! process exits, a failed test included. Should the process be killed
//! outright, a watchdog shell started with each server stops it as soon as
//! the process is gone: no server outlives its test.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// How to run a server.
#[derive(Debug, Clone)]
pub struct PgServerOptions {
    /// `fsync` on (the benchmark's setting: commits cost what they cost in
    /// production) or off (tests: the server is never power-cycled, so the
    /// page cache survives its restarts).
    pub fsync: bool,
    /// `max_connections`.
    pub max_connections: u32,
}

impl Default for PgServerOptions {
    fn default() -> Self {
        PgServerOptions {
            fsync: false,
            max_connections: 200,
        }
    }
}

/// A running server; see the module documentation.
#[derive(Debug)]
pub struct PgServer {
    root: PathBuf,
    pub(crate) data: PathBuf,
    socket: PathBuf,
    bin: PathBuf,
    port: u16,
    /// `Some("postgres")` when we are root.
    user: Option<&'static str>,
    watchdog: Mutex<Option<std::process::Child>>,
    databases: AtomicU64,
}

/// The directory of the server binaries: `IDEM_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`, else `pg_config --bindir`.
pub fn bin_dir() -> io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("IDEM_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Ok(bin);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's `postgresql` \
         package (apt-get install -y postgresql) or set IDEM_PG_BIN to their directory",
    ))
}

/// A fresh directory for servers of this process, named `idem-{what}-{pid}-{n}`
/// in the temporary directory.
pub(crate) fn fresh_root(what: &str) -> io::Result<PathBuf> {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let root = std::env::temp_dir().join(format!("idem-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    Ok(root)
}

/// Appends `text` to the file at `path`.
pub(crate) fn append(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// A shell that outlives this process only to run `stops` (shell command
/// lines) and remove `root` once the process is gone: how no server
/// outlives its test, should the test process be killed outright.
pub(crate) fn watchdog(stops: &[String], root: &Path) -> io::Result<std::process::Child> {
    let stop: String = stops
        .iter()
        .map(|s| format!("{s} >/dev/null 2>&1; "))
        .collect();
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop}rm -rf '{root}'",
        pid = std::process::id(),
        root = root.display(),
    );
    use std::os::unix::process::CommandExt as _;
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a kill of ours (a terminal's ^C, a
        // harness killing a test's group) leaves it to clean up.
        .process_group(0)
        .spawn()
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub(crate) fn run(mut cmd: Command, what: &str) -> io::Result<String> {
    let out = cmd.stdin(Stdio::null()).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

static COUNTER: AtomicU64 = AtomicU64::new(0);
static SHARED: OnceLock<PgServer> = OnceLock::new();

extern "C" fn stop_shared_at_exit() {
    if let Some(server) = SHARED.get() {
        server.shut_down();
    }
}

impl PgServer {
    /// Starts a server with default options (fsync off).
    pub fn start() -> io::Result<PgServer> {
        PgServer::start_with(&PgServerOptions::default())
    }

    /// Starts a server.
    pub fn start_with(options: &PgServerOptions) -> io::Result<PgServer> {
        let root = fresh_root("pg")?;
        let server = PgServer::unstarted(root)?;
        server.start_watchdog()?;
        server.initdb(options, "")?;
        server.start_again()?;
        Ok(server)
    }

    /// A server that is not running yet, in directory `root` (created and
    /// given to the server's user; `data` and `sock` inside it), removed
    /// when it is dropped. No watchdog: [`PgServer::start_watchdog`], or
    /// its owner's (a replicated pair has one for both of its servers).
    pub(crate) fn unstarted(root: PathBuf) -> io::Result<PgServer> {
        let bin = bin_dir()?;
        std::fs::create_dir_all(&root)?;
        let data = root.join("data");
        let socket = root.join("sock");
        std::fs::create_dir_all(&data)?;
        std::fs::create_dir_all(&socket)?;
        let user = is_root().then_some("postgres");
        let server = PgServer {
            root,
            data,
            socket,
            bin,
            port: 5432,
            user,
            watchdog: Mutex::new(None),
            databases: AtomicU64::new(0),
        };
        if let Some(user) = user {
            let mut chown = Command::new("chown");
            chown.arg("-R").arg(format!("{user}:")).arg(&server.root);
            run(chown, "chown the server's directory")?;
        }
        Ok(server)
    }

    /// `initdb`, then this server's settings (its socket, no TCP) and
    /// `extra` appended to `postgresql.conf`.
    pub(crate) fn initdb(&self, options: &PgServerOptions, extra: &str) -> io::Result<()> {
        let mut initdb = self.command("initdb");
        initdb
            .arg("-D")
            .arg(&self.data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync");
        run(initdb, "initdb")?;
        let conf = format!(
            "\n# idem test server\nlisten_addresses = ''\nunix_socket_directories = '{}'\n\
             port = {}\nfsync = {}\nmax_connections = {}\nshared_buffers = 64MB\n\
             log_min_messages = warning\n{extra}",
            self.socket.display(),
            self.port,
            if options.fsync { "on" } else { "off" },
            options.max_connections
        );
        append(&self.data.join("postgresql.conf"), &conf)
    }

    /// The server every test of this process shares (each test makes its
    /// own database with [`PgServer::create_database`]); started on first
    /// use, stopped when the process exits.
    ///
    /// # Panics
    /// If the server cannot be started (PostgreSQL is not installed): a
    /// test that needs it must fail, loudly, rather than skip.
    pub fn shared() -> &'static PgServer {
        SHARED.get_or_init(|| {
            let server = PgServer::start().unwrap_or_else(|e| panic!("{e}"));
            // SAFETY: registers a plain function with no preconditions.
            unsafe {
                libc::atexit(stop_shared_at_exit);
            }
            server
        })
    }

    /// A server command, as the `postgres` user when we are root.
    pub(crate) fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        match self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(path);
                c
            }
            None => Command::new(path),
        }
    }

    /// A shell that outlives us only to stop the server and remove its
    /// directory once this process is gone.
    fn start_watchdog(&self) -> io::Result<()> {
        let child = watchdog(&[self.stop_command_line()], &self.root)?;
        *self.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }

    pub(crate) fn stop_command_line(&self) -> String {
        let pg_ctl = self.bin.join("pg_ctl");
        let runas = self
            .user
            .map_or(String::new(), |u| format!("runuser -u {u} -- "));
        format!(
            "{runas}'{}' -D '{}' stop -m immediate -w",
            pg_ctl.display(),
            self.data.display()
        )
    }

    /// The socket directory.
    pub fn socket_dir(&self) -> &Path {
        &self.socket
    }

    /// The port (with the socket directory, the socket's name).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log file.
    pub fn log_file(&self) -> PathBuf {
        self.root.join("server.log")
    }

    /// The URL of database `db` on this server (user `postgres`).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@/{db}?host={}&port={}",
            self.socket.display(),
            self.port
        )
    }

    /// The database name in a URL made by [`PgServer::url`].
    pub fn database_of(url: &str) -> &str {
        url.split_once("@/")
            .and_then(|(_, rest)| rest.split('?').next())
            .unwrap_or("")
    }

    /// Creates a new, empty database and returns its URL.
    pub fn create_database(&self) -> io::Result<String> {
        let n = self.databases.fetch_add(1, Ordering::SeqCst);
        let name = format!("idem_{}_{n}", std::process::id());
        let mut c = Command::new(self.bin.join("createdb"));
        c.arg("-h")
            .arg(&self.socket)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-T",
                "template0",
            ])
            .arg(&name);
        run(c, "createdb")?;
        Ok(self.url(&name))
    }

    /// Drops the database of a URL made by [`PgServer::url`] (its sessions
    /// are ended first).
    pub fn drop_database(&self, url: &str) -> io::Result<()> {
        let name = PgServer::database_of(url);
        self.psql(
            "postgres",
            &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
        )
        .map(drop)
    }

    /// Runs SQL through `psql` in database `db`; returns its unaligned
    /// output.
    pub fn psql(&self, db: &str, sql: &str) -> io::Result<String> {
        let mut c = Command::new(self.bin.join("psql"));
        c.arg("-h")
            .arg(&self.socket)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", db])
            .args(["-v", "ON_ERROR_STOP=1", "-X", "-A", "-t", "-c", sql]);
        run(c, "psql")
    }

    /// How many of idem's relations (tables, indexes, sequences: `idem%`)
    /// database `db` holds: whether something created the journal's schema.
    pub fn idem_relations(&self, db: &str) -> io::Result<u64> {
        let out = self.psql(
            db,
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'idem%'",
        )?;
        out.trim()
            .parse()
            .map_err(|e| io::Error::other(format!("psql printed {out:?}: {e}")))
    }

    /// Kills the server as a crash would (`pg_ctl stop -m immediate`: no
    /// checkpoint, recovery from the WAL at the next start).
    pub fn stop_immediate(&self) -> io::Result<()> {
        let mut c = self.command("pg_ctl");
        c.arg("-D")
            .arg(&self.data)
            .args(["stop", "-m", "immediate", "-w"]);
        run(c, "pg_ctl stop").map(drop)
    }

    /// Starts the (stopped) server again and waits until it accepts
    /// connections.
    pub fn start_again(&self) -> io::Result<()> {
        let mut c = self.command("pg_ctl");
        c.arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.log_file())
            .args(["-w", "-t", "60", "start"]);
        run(c, "pg_ctl start").map(drop)
    }

    /// A crash and a restart of the server.
    pub fn restart_immediate(&self) -> io::Result<()> {
        self.stop_immediate()?;
        self.start_again()
    }

    pub(crate) fn shut_down(&self) {
        let _ = self.stop_immediate();
        if let Some(mut w) = self
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = w.kill();
            let _ = w.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.shut_down();
    }
}
