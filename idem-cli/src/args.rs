//! The command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

const AFTER_HELP: &str = "\
Finding the journal:
  --journal DIR   talks to the process that holds the journal through its admin API
                  (it writes DIR/idem-admin-addr when it starts with
                  Runtime::builder().path(DIR).admin(\"127.0.0.1:0\")), or opens the
                  journal directly when no process holds it.
  --url URL       talks to an admin API at URL (e.g. through a tunnel); the token
                  comes from IDEM_ADMIN_TOKEN.
  --postgres URL  the shared PostgreSQL journal of several workers (e.g.
                  postgres://idem@/idem?host=/run/idem-pg): idem connects to it as one
                  more client, under the worker id idem-cli@HOST-PID. Only `migrate`
                  creates its tables (elsewhere a database without them exits with
                  code 3), so the other commands need only the rows' privileges.
                  Everything works but --landed (only a worker that defines the tool
                  can check a result: use --worker ID, or --url with its admin API); `audit --follow`
                  polls the shared stream and waits out a database restart; `prune`
                  needs --keep.
  --worker ID     talks to the running worker ID on this machine through its admin
                  API: a worker without a journal directory (PostgreSQL) started with
                  .admin(\"127.0.0.1:0\") keeps its address and token in ID's directory
                  of the workers directory ($IDEM_WORKERS_DIR, else
                  $XDG_RUNTIME_DIR/idem/workers, else $HOME/.local/state/idem/workers).
                  `idem workers` lists them. This is how --landed reaches a worker.
Give one of the four. The token is IDEM_ADMIN_TOKEN when set, else
DIR/idem-admin-token (the worker's directory with --worker).

Exit codes:
  0  done
  1  refused or failed (unknown key, not escalated, a result that does not fit the
     tool's type, a journal error)
  2  bad command line
  3  the journal cannot be reached (no journal, held by a process without the admin
     API, the process does not answer, a database that cannot be reached or has no
     idem journal)
  4  the admin API refused the token, or did not prove that it holds it (then the
     token is not sent)

Errors go to stderr (as JSON with --json).";

/// Operate an idem journal: escalations, resolutions, the audit stream.
#[derive(Debug, Parser)]
#[command(name = "idem", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// The journal directory.
    #[arg(
        long,
        short = 'j',
        value_name = "DIR",
        env = "IDEM_JOURNAL",
        global = true
    )]
    pub journal: Option<PathBuf>,

    /// The URL of a running process's admin API, instead of --journal.
    #[arg(long, value_name = "URL", env = "IDEM_ADMIN_URL", global = true)]
    pub url: Option<String>,

    /// The shared PostgreSQL journal at URL, instead of --journal or --url.
    #[arg(long, value_name = "URL", global = true)]
    pub postgres: Option<String>,

    /// The running worker with this id on this machine, through its admin
    /// API (found in the workers directory; see `idem workers`).
    #[arg(long, value_name = "ID", env = "IDEM_WORKER", global = true)]
    pub worker: Option<String>,

    /// Machine-readable output: JSON (JSON lines for `audit`).
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The tools of the running program, with their class, key and policies.
    Tools,
    /// Operations parked for a human, with their evidence.
    Escalations,
    /// One operation and its whole history.
    Show {
        /// The operation's key (as `idem escalations` shows it).
        key: String,
    },
    /// Settles an escalated operation (or amends an earlier resolution).
    Resolve {
        /// The operation's key.
        key: String,
        /// How.
        #[command(flatten)]
        how: How,
        /// Why: what the decision rests on (required).
        #[arg(long, value_name = "TEXT")]
        note: String,
    },
    /// Calls waiting for a person's approval, with what would run.
    Approvals,
    /// Approves a call awaiting approval: its next call (or the one
    /// waiting) runs it, once.
    Approve {
        /// The operation's key (as `idem approvals` shows it).
        key: String,
        /// Why: what was checked (required).
        #[arg(long, value_name = "TEXT")]
        note: String,
    },
    /// Refuses a call awaiting approval: it never runs, and the agent reads
    /// the note.
    Reject {
        /// The operation's key (as `idem approvals` shows it).
        key: String,
        /// Why (required): the agent, and the model behind it, read it.
        #[arg(long, value_name = "TEXT")]
        note: String,
    },
    /// Sagas: running, compensating, compensated or escalated, with why,
    /// the steps undone and what is left.
    Sagas,
    /// The audit stream (JSON lines with --json).
    Audit {
        /// Start at this sequence number, or `end` for only what comes next.
        #[arg(long, value_name = "N|end", default_value = "0")]
        from: String,
        /// Keep printing events as they happen (needs a running process, or
        /// --postgres).
        #[arg(long)]
        follow: bool,
        /// Stop after this many events.
        #[arg(long, value_name = "N", conflicts_with = "follow")]
        limit: Option<u64>,
    },
    /// Per-tool counts: calls, retries, dedupe hits, replays, escalations.
    Stats,
    /// The workers of this machine's workers directory (PostgreSQL workers
    /// serving the admin API), and whether each one answers.
    Workers,
    /// With --postgres: creates the journal's tables, or checks that the
    /// ones there are a version this build reads (idempotent; safe while
    /// workers run).
    Migrate,
    /// Removes finished operations, steps and events past the retention.
    Prune {
        /// With no running process, and with --postgres: how long to keep
        /// finished operations (e.g. `7d`; at least the longest
        /// dedupe_window of your tools). A running process uses its own
        /// retention.
        #[arg(long, value_name = "DURATION")]
        keep: Option<String>,
    },
}

/// The resolution: exactly one of these.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct How {
    /// It landed; JSON is the provider's result, replayed to later calls (it
    /// must fit the tool's result type).
    #[arg(long, value_name = "JSON")]
    pub landed: Option<String>,
    /// It landed; the result is the JSON in FILE (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    pub landed_file: Option<PathBuf>,
    /// It did not land: the next call runs it again (same key).
    #[arg(long)]
    pub reissue: bool,
    /// Never run it: later calls return Abandoned.
    #[arg(long)]
    pub abandon: bool,
}
