//! A throwaway PostgreSQL primary with a synchronous streaming standby,
//! for failover tests: two [`PgServer`]s in two fixed *slots* (each its own
//! data directory and unix socket directory), one the primary, the other a
//! standby made with `pg_basebackup -R` and named in the primary's
//! `synchronous_standby_names`, so that no commit is acknowledged before
//! the standby has flushed it.
//!
//! A failover is [`PgPair::stop_immediate`] (the primary crashes) and
//! [`PgPair::promote`] (the standby becomes the primary);
//! [`PgPair::rebuild_standby`] then makes a new standby of the promoted
//! primary in the dead primary's slot, so that a second failover can go
//! back. Since the slots never move, one multi-host URL ([`PgPair::url`])
//! reaches whichever slot is the primary (`target_session_attrs=read-write`
//! skips the standby, which is read-only).
//!
//! Each slot's settings that must differ from its peer's (its socket
//! directory, `primary_conninfo`, the name its own standby will have) are
//! appended to its `postgresql.auto.conf` after `pg_basebackup` copied the
//! peer's: a later line wins. A promoted standby names the other slot in
//! `synchronous_standby_names` from the start, so until a new standby of it
//! connects its commits wait (none is acknowledged that only it has).
//!
//! [`PgPair::start_asynchronous`] makes a pair without
//! `synchronous_standby_names`, and [`PgPair::stop_standby`] a standby
//! that lags (is down): what asynchronous replication loses at a failover
//! can then be shown, deterministically.
//!
//! Cleanup is [`PgServer`]'s: both servers are stopped (`-m immediate`) and
//! the directory removed when the pair is dropped, and one watchdog shell
//! stops both slots' servers should the test process be killed outright.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::pg::{append, fresh_root, run, watchdog, PgServer, PgServerOptions};

/// The slots' names: the `application_name` of a slot's server when it is
/// the standby (what the primary's `synchronous_standby_names` names).
const NAMES: [&str; 2] = ["idem_a", "idem_b"];

/// How long the pair waits for a server to reach a state (a standby to be
/// synchronous, a promotion to finish).
const PATIENCE: Duration = Duration::from_secs(60);

/// A primary and its synchronous standby; see the module documentation.
#[derive(Debug)]
pub struct PgPair {
    root: PathBuf,
    /// The two slots' servers (`None` only while one is being rebuilt).
    nodes: [Option<PgServer>; 2],
    /// The slot of the primary.
    primary: usize,
    /// Whether the other slot holds a running standby.
    standby_up: bool,
    /// Whether the primary names its standby in
    /// `synchronous_standby_names` (else it replicates asynchronously).
    synchronous: bool,
    watchdog: Option<std::process::Child>,
    databases: AtomicU64,
}

impl PgPair {
    /// Starts a primary and a synchronous standby of it, with default
    /// options (fsync off), and waits until the standby is synchronous.
    pub fn start() -> io::Result<PgPair> {
        PgPair::start_with(&PgServerOptions::default())
    }

    /// [`PgPair::start`] with options (the standby copies the primary's
    /// settings).
    pub fn start_with(options: &PgServerOptions) -> io::Result<PgPair> {
        PgPair::start_replicating(options, true)
    }

    /// A pair that replicates *asynchronously*: no `synchronous_standby_names`
    /// on either server, so the primary acknowledges commits its standby
    /// may not have (what a failover then loses, for tests that show it).
    /// Otherwise as [`PgPair::start`]; the standby is streaming when it
    /// returns.
    pub fn start_asynchronous() -> io::Result<PgPair> {
        PgPair::start_replicating(&PgServerOptions::default(), false)
    }

    fn start_replicating(options: &PgServerOptions, synchronous: bool) -> io::Result<PgPair> {
        let root = fresh_root("pg-pair")?;
        let a = PgServer::unstarted(root.join("a"))?;
        let b = PgServer::unstarted(root.join("b"))?;
        let child = watchdog(&[a.stop_command_line(), b.stop_command_line()], &root)?;
        let mut pair = PgPair {
            root,
            nodes: [Some(a), Some(b)],
            primary: 0,
            standby_up: false,
            synchronous,
            watchdog: Some(child),
            databases: AtomicU64::new(0),
        };
        let replication = format!(
            "wal_level = replica\nmax_wal_senders = 8\nhot_standby = on\n\
             synchronous_commit = on\nsynchronous_standby_names = '{}'\n",
            pair.standby_name(1)
        );
        let primary = pair.node(0);
        primary.initdb(options, &replication)?;
        // initdb's trust configuration allows replication on the socket
        // already; said again so that the pair does not depend on it.
        append(
            &primary.data.join("pg_hba.conf"),
            "\nlocal replication all trust\n",
        )?;
        primary.start_again()?;
        pair.make_standby()?;
        Ok(pair)
    }

    /// What a primary names in `synchronous_standby_names` for a standby
    /// in `slot`: its `application_name`, or nothing when asynchronous.
    fn standby_name(&self, slot: usize) -> &'static str {
        if self.synchronous {
            NAMES[slot]
        } else {
            ""
        }
    }

    fn node(&self, slot: usize) -> &PgServer {
        self.nodes[slot]
            .as_ref()
            .expect("a slot is empty only while it is rebuilt")
    }

    /// The current primary.
    pub fn primary(&self) -> &PgServer {
        self.node(self.primary)
    }

    /// The running standby: none between a [`PgPair::stop_immediate`] of
    /// the primary and the next [`PgPair::rebuild_standby`] (after
    /// [`PgPair::promote`] the standby is the primary).
    pub fn standby(&self) -> Option<&PgServer> {
        self.standby_up.then(|| self.node(1 - self.primary))
    }

    /// The slot (0 or 1) of the current primary.
    pub fn primary_slot(&self) -> usize {
        self.primary
    }

    /// The URL of database `db` on whichever server is the primary, for
    /// tokio-postgres: both slots' socket directories as `host`
    /// parameters, one each (tokio-postgres's URL form takes a unix socket
    /// directory per `host=`, in the query; a comma there would be part of
    /// the path), with their `port`s (these split on commas), tried in
    /// order, and `target_session_attrs=read-write`, so that a read-only
    /// server (the standby) is skipped. libpq reads repeated `host`s
    /// otherwise (the last wins): for `psql`, [`PgPair::conninfo`].
    pub fn url(&self, db: &str) -> String {
        let (a, b) = (self.node(0), self.node(1));
        format!(
            "postgres://postgres@/{db}?host={}&host={}&port={},{}&target_session_attrs=read-write",
            a.socket_dir().display(),
            b.socket_dir().display(),
            a.port(),
            b.port()
        )
    }

    /// [`PgPair::url`] as a `key=value` connection string
    /// (`host=/a,/b port=p,q ...`), which libpq (`psql`) and tokio-postgres
    /// read alike.
    pub fn conninfo(&self, db: &str) -> String {
        let (a, b) = (self.node(0), self.node(1));
        format!(
            "host={},{} port={},{} user=postgres dbname={db} target_session_attrs=read-write",
            a.socket_dir().display(),
            b.socket_dir().display(),
            a.port(),
            b.port()
        )
    }

    /// Creates a new, empty database on the primary (and so, replicated,
    /// on the standby) and returns its multi-host [`PgPair::url`].
    /// [`PgServer::database_of`] reads its name back.
    pub fn create_database(&self) -> io::Result<String> {
        let n = self.databases.fetch_add(1, Ordering::SeqCst);
        let name = format!("idem_pair_{}_{n}", std::process::id());
        self.primary()
            .psql("postgres", &format!("CREATE DATABASE \"{name}\""))?;
        Ok(self.url(&name))
    }

    /// Crashes the primary (`pg_ctl stop -m immediate`): what it had
    /// acknowledged, the synchronous standby has.
    pub fn stop_immediate(&mut self) -> io::Result<()> {
        self.primary().stop_immediate()
    }

    /// Stops the standby (`pg_ctl stop -m fast`): the primary's commits
    /// wait for it from now on (none is acknowledged), until
    /// [`PgPair::start_standby`]. Its WAL ends here: crash the primary now
    /// and start it again, and a promotion finds only what it had.
    pub fn stop_standby(&mut self) -> io::Result<()> {
        let node = self
            .standby()
            .ok_or_else(|| io::Error::other("no standby to stop"))?;
        let mut c = node.command("pg_ctl");
        c.arg("-D")
            .arg(&node.data)
            .args(["stop", "-m", "fast", "-w"]);
        run(c, "pg_ctl stop (the standby)").map(drop)
    }

    /// Starts the standby stopped by [`PgPair::stop_standby`] again (it
    /// reconnects to the primary, if that is still running).
    pub fn start_standby(&mut self) -> io::Result<()> {
        let node = self
            .standby()
            .ok_or_else(|| io::Error::other("no standby to start"))?;
        node.start_again()
    }

    /// Promotes the standby (`pg_ctl promote`) and waits until it is out of
    /// recovery (`pg_is_in_recovery()` false): it is the primary from now
    /// on, and has no standby until [`PgPair::rebuild_standby`] (its
    /// commits wait for one meanwhile). The old primary must be stopped
    /// first ([`PgPair::stop_immediate`]).
    pub fn promote(&mut self) -> io::Result<()> {
        if !self.standby_up {
            return Err(io::Error::other("no standby to promote"));
        }
        let standby = 1 - self.primary;
        let node = self.node(standby);
        let mut c = node.command("pg_ctl");
        c.arg("-D")
            .arg(&node.data)
            .args(["promote", "-w", "-t", "60"]);
        run(c, "pg_ctl promote")?;
        wait_for(
            node,
            "postgres",
            "SELECT NOT pg_is_in_recovery()",
            "promoted",
        )?;
        self.primary = standby;
        self.standby_up = false;
        Ok(())
    }

    /// Makes a new standby of the primary in the other slot (whatever was
    /// there, the stopped old primary, is removed first), names it in the
    /// primary's `synchronous_standby_names` (`ALTER SYSTEM`, reloaded) and
    /// waits until it is synchronous.
    pub fn rebuild_standby(&mut self) -> io::Result<()> {
        let slot = 1 - self.primary;
        if self.standby_up {
            return Err(io::Error::other("the pair has a standby already"));
        }
        // Stopped (if it was not) and its directory removed.
        drop(self.nodes[slot].take());
        self.nodes[slot] = Some(PgServer::unstarted(self.root.join(["a", "b"][slot]))?);
        let primary = self.primary();
        primary.psql(
            "postgres",
            &format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{}'",
                self.standby_name(slot)
            ),
        )?;
        primary.psql("postgres", "SELECT pg_reload_conf()")?;
        self.make_standby()
    }

    /// `pg_basebackup -R` of the primary into the other slot, that slot's
    /// own settings, its start, and the wait until it is synchronous.
    fn make_standby(&mut self) -> io::Result<()> {
        let slot = 1 - self.primary;
        let (primary, node) = (self.primary(), self.node(slot));
        // pg_basebackup creates the data directory itself, with the
        // permissions the server requires.
        std::fs::remove_dir_all(&node.data)?;
        let mut c = node.command("pg_basebackup");
        c.arg("-h")
            .arg(primary.socket_dir())
            .args(["-p", &primary.port().to_string(), "-U", "postgres", "-D"])
            .arg(&node.data)
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]);
        run(c, "pg_basebackup")?;
        let own = format!(
            "\n# slot {slot} of the pair, as a standby\n\
             unix_socket_directories = '{sock}'\n\
             primary_conninfo = 'host={primary_sock} port={port} user=postgres application_name={name}'\n\
             synchronous_standby_names = '{peer}'\n",
            sock = node.socket_dir().display(),
            primary_sock = primary.socket_dir().display(),
            port = primary.port(),
            name = NAMES[slot],
            peer = self.standby_name(1 - slot),
        );
        append(&node.data.join("postgresql.auto.conf"), &own)?;
        node.start_again()?;
        self.standby_up = true;
        self.wait_synchronous()
    }

    /// Waits until the standby is connected to the primary as its
    /// synchronous standby (`pg_stat_replication.sync_state = 'sync'`), or
    /// streaming, for a pair made by [`PgPair::start_asynchronous`].
    pub fn wait_synchronous(&self) -> io::Result<()> {
        let name = NAMES[1 - self.primary];
        let (state, what) = if self.synchronous {
            ("sync_state = 'sync'", "synchronous")
        } else {
            ("state = 'streaming'", "streaming")
        };
        wait_for(
            self.primary(),
            "postgres",
            &format!(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_replication \
                 WHERE application_name = '{name}' AND {state})"
            ),
            what,
        )
    }
}

/// Polls `sql` (one boolean) on `server` until it is true, for up to
/// [`PATIENCE`].
fn wait_for(server: &PgServer, db: &str, sql: &str, what: &str) -> io::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    let mut last = String::new();
    while Instant::now() < deadline {
        match server.psql(db, sql) {
            Ok(out) if out.trim() == "t" => return Ok(()),
            Ok(out) => last = out.trim().to_string(),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(io::Error::other(format!(
        "the server was not {what} within {PATIENCE:?} (last: {last}); its log: {}",
        server.log_file().display()
    )))
}

impl Drop for PgPair {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            drop(node.take());
        }
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
