//! Where the commands go: the running process's admin API, the journal
//! opened by this process when nobody holds it, or the shared PostgreSQL
//! journal, which this process joins as one more client.

use std::path::{Path, PathBuf};

use idem_runtime::admin::{
    workers, AddressFile, Decided, DecisionRequest, OperationView, PruneView, ResolveRequest,
    Resolved, StatsView, ToolInfo,
};
use idem_runtime::{Approval, AuditEvent, Escalation, IdemKey, Runtime, SagaView};

use crate::client::Client;
use crate::error::{exit, CliError};
use crate::reach::{reach, Unreached};

/// What answers the commands.
#[derive(Debug)]
pub enum Backend {
    /// The process that holds the journal, through its admin API.
    Remote(Client),
    /// The journal itself, opened by this process (no process held it).
    Local {
        /// The open journal.
        rt: Runtime,
        /// Its directory.
        dir: PathBuf,
    },
    /// The shared PostgreSQL journal, connected to by this process beside
    /// the workers (see [`Backend::postgres`]).
    Postgres {
        /// The connected journal.
        rt: Runtime,
    },
}

// What a journal opened directly knows of its tools is shown by `render`,
// which defines it; commands reach it here.
pub use crate::render::ToolName;

impl Backend {
    /// Finds the process serving the journal in `dir`, or opens the journal
    /// when no process holds it.
    /// `keep`: the retention to open the journal with, if it is opened
    /// directly (for `prune`).
    pub async fn discover(
        dir: &Path,
        keep: Option<std::time::Duration>,
    ) -> Result<Backend, CliError> {
        match std::fs::read_dir(dir) {
            Ok(mut entries) => {
                if entries.next().is_none() {
                    return Err(CliError::unreachable(format!(
                        "{} is empty: no journal there",
                        dir.display()
                    )));
                }
            }
            Err(e) => {
                return Err(CliError::unreachable(format!(
                    "no journal at {}: {e}",
                    dir.display()
                )))
            }
        }
        let address = AddressFile::read(dir).map_err(|e| CliError::unreachable(e.to_string()))?;
        // Why the address file did not lead to the process, for the error
        // if the journal turns out to be held.
        let mut not_there: Option<CliError> = None;
        if let Some(address) = &address {
            match reach(dir, address).await {
                Ok(client) => return Ok(Backend::Remote(client)),
                // The process that wrote it is gone (or something else
                // listens there now): the journal may be free.
                Err(Unreached::NoAnswer(_)) => {}
                Err(Unreached::Refused(e)) => not_there = Some(e),
            }
        }
        let mut builder = Runtime::builder().path(dir);
        if let Some(keep) = keep {
            builder = builder.retention(keep);
        }
        match builder.open() {
            Ok(rt) => {
                if address.is_some() {
                    // We hold the journal: nobody serves it.
                    let _ = std::fs::remove_file(idem_runtime::admin::address_path(dir));
                }
                Ok(Backend::Local {
                    rt,
                    dir: dir.to_path_buf(),
                })
            }
            // Held by a process the address file did not lead to: why not,
            // when it is known (a refused file, an unproven server).
            Err(idem_runtime::Error::InUse { .. }) => Err(not_there.unwrap_or_else(|| {
                CliError::unreachable(format!(
                    "journal in use: {} is held by a process that does not serve the admin API{}",
                    dir.display(),
                    match &address {
                        Some(a) => format!(
                            " (its address file names {}, which does not answer as that process)",
                            a.url
                        ),
                        None => " (there is no idem-admin-addr in the directory)".into(),
                    }
                ))
                .hint(
                    "start that process with Runtime::builder().path(DIR).admin(\"127.0.0.1:0\") \
                     (feature `admin` of idem) to operate on its journal while it runs, or stop it",
                )
            })),
            Err(e) => Err(CliError::runtime(&e)),
        }
    }

    /// The worker `id` whose admin files are in the workers directory (see
    /// [`idem_runtime::admin::workers`]): a PostgreSQL worker started with
    /// `.admin("127.0.0.1:0")` on this machine.
    pub async fn worker(id: &str) -> Result<Backend, CliError> {
        let workers = workers::workers_dir().map_err(|e| CliError::usage(e.to_string()))?;
        let shown = crate::render::escape(id).into_owned();
        let lists = "`idem workers` lists the workers it finds there";
        let found = workers::find_worker_dir(&workers, id)
            .map_err(|e| CliError::unreachable(e.to_string()))?;
        let Some(dir) = found else {
            return Err(CliError::unreachable(format!(
                "no worker {shown:?} in {}",
                workers.display()
            ))
            .hint(format!(
                "start it with Runtime::builder().worker_id({shown:?}).admin(\"127.0.0.1:0\") \
                 as the same user (with the same {} if the worker has one); {lists}",
                workers::WORKERS_DIR_ENV
            )));
        };
        let address = AddressFile::read(&dir)
            .map_err(|e| CliError::unreachable(e.to_string()))?
            .ok_or_else(|| {
                CliError::unreachable(format!(
                    "worker {shown:?} is not running: {} has no {}",
                    dir.display(),
                    idem_runtime::admin::ADDRESS_FILE
                ))
                .hint(lists)
            })?;
        match reach(&dir, &address).await {
            Ok(client) => Ok(Backend::Remote(client)),
            Err(Unreached::NoAnswer(why)) => Err(CliError::unreachable(format!(
                "worker {shown:?} does not answer at {}: {why}",
                crate::render::escape(&address.url)
            ))
            .hint(format!(
                "it stopped without removing its address file, or is stopped; {lists}"
            ))),
            Err(Unreached::Refused(e)) => Err(e),
        }
    }

    /// Connects to the PostgreSQL journal at `url` as one more client of
    /// it, with a worker id of the CLI's own (`idem-cli@HOST-PID`). Exit
    /// code 2 when `url` is not a connection string, 3 when the database
    /// cannot be reached or holds no idem journal (none is created).
    /// `keep`: the retention to prune with.
    pub async fn postgres(
        url: &str,
        keep: Option<std::time::Duration>,
    ) -> Result<Backend, CliError> {
        Ok(Backend::Postgres {
            rt: crate::pg::connect(url, keep).await?,
        })
    }

    /// Whether the commands go to a running process.
    pub fn is_remote(&self) -> bool {
        matches!(self, Backend::Remote(_))
    }

    /// Why this backend knows tools only by name: a journal opened here
    /// has no descriptors (a running process has; its answer is empty).
    pub fn no_registry(&self) -> &'static str {
        match self {
            Backend::Remote(_) => "",
            Backend::Local { .. } => {
                "no running process: tool descriptors live in the program that defines the tools"
            }
            Backend::Postgres { .. } => {
                "idem has no tool registry: tool descriptors live in the workers that define the \
                 tools (ask one through its admin API with --worker ID or --url)"
            }
        }
    }

    /// The running program's tools (remote), or the tool names in the
    /// journal's audit stream (a journal opened here).
    pub async fn tools(&self) -> Result<Result<Vec<ToolInfo>, Vec<ToolName>>, CliError> {
        match self {
            Backend::Remote(c) => c.tools().await.map(Ok),
            Backend::Local { rt, .. } | Backend::Postgres { rt, .. } => {
                let stats = rt.stats().await.map_err(|e| CliError::runtime(&e))?;
                Ok(Err(stats
                    .tools
                    .into_iter()
                    .map(|(name, s)| ToolName {
                        name,
                        calls: s.calls,
                    })
                    .collect()))
            }
        }
    }

    /// Every parked operation, oldest first.
    pub async fn escalations(&self) -> Result<Vec<Escalation>, CliError> {
        match self {
            Backend::Remote(c) => c.escalations().await,
            Backend::Local { rt, .. } | Backend::Postgres { rt, .. } => {
                rt.escalations().await.map_err(|e| CliError::runtime(&e))
            }
        }
    }

    /// One operation and its history.
    pub async fn operation(&self, key: &str) -> Result<OperationView, CliError> {
        match self {
            Backend::Remote(c) => c.operation(key).await,
            Backend::Local { rt, .. } | Backend::Postgres { rt, .. } => {
                let key = parse_key(key)?;
                let operation = rt
                    .operation(&key)
                    .await
                    .map_err(|e| CliError::runtime(&e))?
                    .ok_or_else(|| {
                        CliError::runtime(&idem_runtime::Error::UnknownKey { key: key.clone() })
                    })?;
                let history = rt.history(&key).await.map_err(|e| CliError::runtime(&e))?;
                Ok(OperationView { operation, history })
            }
        }
    }

    /// Settles an operation.
    pub async fn resolve(&self, key: &str, request: &ResolveRequest) -> Result<Resolved, CliError> {
        match self {
            Backend::Remote(c) => c.resolve(key, request).await,
            Backend::Local { rt, .. } | Backend::Postgres { rt, .. } => {
                let key = parse_key(key)?;
                let resolution = request.to_resolution().map_err(CliError::usage)?;
                let landed = matches!(resolution, idem_runtime::Resolution::Landed(_));
                rt.resolve(&key, resolution, &request.note)
                    .await
                    .map_err(|e| {
                        let error = CliError::runtime(&e);
                        if landed && matches!(e, idem_runtime::Error::ResultType { .. }) {
                            error.hint(self.unchecked_landed_hint())
                        } else {
                            error
                        }
                    })?;
                let operation = rt
                    .operation(&key)
                    .await
                    .map_err(|e| CliError::runtime(&e))?
                    .ok_or_else(|| {
                        CliError::new(exit::REFUSED, "unknown_key", "the operation vanished")
                    })?;
                Ok(Resolved {
                    key: operation.key.to_string(),
                    resolution: request.resolution.clone(),
                    operation,
                })
            }
        }
    }

    /// Every call awaiting approval, oldest request first.
    pub async fn approvals(&self) -> Result<Vec<Approval>, CliError> {
        match self {
            Backend::Remote(c) => c.approvals().await,
            Backend::Local { rt, .. } | Backend::Postgres { rt, .. } => {
                rt.approvals().await.map_err(|e| CliError::runtime(&e))
            }
        }
    }

    /// Every saga the journal holds, oldest start first.
    pub async fn sagas(&self) -> Result<Vec<SagaView>, CliError> {
        match self {
            Backend::Remote(c) => c.sagas().await,
            Backend::Local { rt, .. } | Backend::Postgres { rt, .. } => {
                rt.sagas().await.map_err(|e| CliError::runtime(&e))
            }
        }
    }

    /// Approves or refuses a call awaiting approval (the record says it
    /// came through the CLI).
    pub async fn decide(
        &self,
        key: &str,
        approved: bool,
        note: String,
    ) -> Result<Decided, CliError> {
        let request = DecisionRequest {
            note,
            via: Some("cli".into()),
        };
        request.checked().map_err(CliError::usage)?;
        match self {
            Backend::Remote(c) => c.decide(key, approved, &request).await,
            Backend::Local { rt, .. } | Backend::Postgres { rt, .. } => {
                let key = parse_key(key)?;
                rt.decide_approval(&key, approved, &request.note, "cli")
                    .await
                    .map_err(|e| CliError::runtime(&e))?;
                let operation = rt
                    .operation(&key)
                    .await
                    .map_err(|e| CliError::runtime(&e))?
                    .ok_or_else(|| {
                        CliError::new(exit::REFUSED, "unknown_key", "the operation vanished")
                    })?;
                Ok(Decided {
                    key: operation.key.to_string(),
                    decision: if approved { "approved" } else { "not_approved" }.into(),
                    operation,
                })
            }
        }
    }

    /// The audit stream from `from` (a number or `end`).
    pub async fn audit(
        &self,
        from: &str,
        follow: bool,
        limit: Option<u64>,
        each: &mut dyn FnMut(AuditEvent) -> Result<(), CliError>,
    ) -> Result<(), CliError> {
        match self {
            Backend::Remote(c) => c.audit(from, follow, limit, each).await,
            Backend::Postgres { rt, .. } => {
                let next = match from {
                    // Only what comes next: nothing, unless following.
                    "end" if !follow => return Ok(()),
                    "end" => end_of_stream(rt).await?,
                    n => parse_from(n)?,
                };
                read_stream(rt, next, follow, limit, each).await
            }
            Backend::Local { rt, .. } => {
                if follow {
                    return Err(CliError::unreachable(
                        "--follow needs a running process: no process serves this journal, \
                         so nothing can happen in it while idem has it open (and holding it \
                         would keep workers from opening it)",
                    )
                    .hint("start the worker with .admin(\"127.0.0.1:0\") and follow its stream"));
                }
                if from == "end" {
                    return Ok(());
                }
                read_stream(rt, parse_from(from)?, false, limit, each).await
            }
        }
    }

    /// Per-tool counts and the journal's size.
    pub async fn stats(&self) -> Result<StatsView, CliError> {
        match self {
            Backend::Remote(c) => c.stats().await,
            Backend::Local { rt, .. } | Backend::Postgres { rt, .. } => Ok(StatsView {
                stats: rt.stats().await.map_err(|e| CliError::runtime(&e))?,
                journal_bytes: rt.size_on_disk().await.map_err(|e| CliError::runtime(&e))?,
            }),
        }
    }

    /// Prunes: through the process (its retention), or directly with the
    /// retention `keep` the operator gives.
    pub async fn prune(&self, keep: Option<std::time::Duration>) -> Result<PruneView, CliError> {
        match (self, keep) {
            (Backend::Remote(_), Some(_)) => Err(CliError::usage(
                "--keep is for a journal no process holds: the running process prunes with \
                 its own retention (RuntimeBuilder::retention, raised to its tools' longest \
                 dedupe_window)",
            )),
            (Backend::Remote(c), None) => c.prune().await,
            (Backend::Local { .. }, None) => Err(CliError::usage(
                "no running process serves this journal, so idem cannot know how long its \
                 tools need finished operations kept (the retention is raised to their longest \
                 dedupe_window): give --keep DURATION, e.g. --keep 7d",
            )),
            (Backend::Postgres { .. }, None) => Err(CliError::usage(
                "idem has no tool registry, so it cannot know how long the workers' tools need \
                 finished operations kept (a worker raises its retention to their longest \
                 dedupe_window): give --keep DURATION, at least that window, e.g. --keep 7d",
            )),
            (Backend::Local { rt, .. }, Some(_)) => {
                // Opened with that retention (see `discover`).
                rt.prune().await.map_err(|e| CliError::runtime(&e))
            }
            (Backend::Postgres { rt, .. }, Some(_)) => {
                // Connected with that retention (see `pg::connect`); the
                // CLI defines no tools, so no dedupe_window raises it.
                rt.prune().await.map_err(|e| CliError::runtime(&e))
            }
        }
    }

    /// What to do instead of a `--landed` that this process cannot check.
    fn unchecked_landed_hint(&self) -> String {
        match self {
            Backend::Postgres { .. } => "only a worker that defines the tool can check the \
                 result against its type: run the same command with --worker ID instead of \
                 --postgres, for a worker started with .admin(\"127.0.0.1:0\") on this machine \
                 (`idem workers` lists them), or --url for one elsewhere"
                .to_string(),
            Backend::Local { dir, .. } => format!(
                "no running process serves this journal, and only the program that defines the \
                 tool can check a result against its type. Start the worker with \
                 Runtime::builder().path({dir:?}).admin(\"127.0.0.1:0\") and run this command \
                 again (idem finds it through its idem-admin-addr file), or settle it in the \
                 inbox that process serves; --reissue and --abandon need no type check",
                dir = dir.display().to_string()
            ),
            // The running process checks the result itself.
            Backend::Remote(_) => String::new(),
        }
    }
}

/// Events per read of the stream.
const PAGE: usize = 1024;

/// `--from N`.
fn parse_from(from: &str) -> Result<u64, CliError> {
    from.parse().map_err(|_| {
        CliError::usage(format!(
            "--from {from:?}: expected a sequence number or `end`"
        ))
    })
}

/// The sequence number after the last durable event: where `--from end`
/// starts. The stream has no index of its end, so this reads it through
/// (a page at a time, as the admin API does the first time it is asked).
async fn end_of_stream(rt: &Runtime) -> Result<u64, CliError> {
    rt.sync().await.map_err(|e| CliError::runtime(&e))?;
    let mut next = 0;
    loop {
        let page = rt
            .audit_page(next, PAGE)
            .await
            .map_err(|e| CliError::runtime(&e))?;
        match page.last() {
            Some(last) => next = last.seq + 1,
            None => return Ok(next),
        }
    }
}

/// Hands `each` the durable events from `next`, at most `limit` of them.
/// Without `follow` it is a snapshot of everything written so far (made
/// durable first). With it, it never ends: at the end of the stream it
/// reads again every [`FOLLOW_POLL`](crate::pg::FOLLOW_POLL), since the
/// events come from other processes; and once it has read the stream, a
/// database it cannot reach (restarted, or the network between) is waited
/// for, said on stderr, instead of ending the follow: an operator watching
/// the stream should not have to notice a restart and start it again. It
/// goes on from the next unread event, so nothing is skipped or repeated.
async fn read_stream(
    rt: &Runtime,
    mut next: u64,
    follow: bool,
    limit: Option<u64>,
    each: &mut dyn FnMut(AuditEvent) -> Result<(), CliError>,
) -> Result<(), CliError> {
    if !follow {
        rt.sync().await.map_err(|e| CliError::runtime(&e))?;
    }
    let mut left = limit.unwrap_or(u64::MAX);
    let mut read_once = false;
    let mut outage = false;
    while left > 0 {
        let page = match rt
            .audit_page(next, PAGE.min(usize::try_from(left).unwrap_or(PAGE)))
            .await
        {
            Ok(page) => page,
            Err(e @ idem_runtime::Error::Storage { .. }) if follow && read_once => {
                if !outage {
                    eprintln!(
                        "idem: cannot read the stream ({}); trying again every {} ms",
                        crate::render::escape(&e.to_string()),
                        crate::pg::FOLLOW_RETRY.as_millis()
                    );
                    outage = true;
                }
                tokio::time::sleep(crate::pg::FOLLOW_RETRY).await;
                continue;
            }
            Err(e) => return Err(CliError::runtime(&e)),
        };
        read_once = true;
        if outage {
            eprintln!("idem: reading the stream again, from seq {next}");
            outage = false;
        }
        let Some(last) = page.last().map(|e| e.seq) else {
            if !follow {
                break;
            }
            tokio::time::sleep(crate::pg::FOLLOW_POLL).await;
            continue;
        };
        left = left.saturating_sub(page.len() as u64);
        for event in page {
            each(event)?;
        }
        next = last + 1;
    }
    Ok(())
}

fn parse_key(key: &str) -> Result<IdemKey, CliError> {
    IdemKey::parse(key).map_err(|e| CliError::runtime(&idem_runtime::Error::from(e)))
}
