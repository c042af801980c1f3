//! `idem`, the operator's command for an idem journal.
//!
//! ```text
//! idem --journal DIR escalations                      # what waits for a human, with its evidence
//! idem --journal DIR show KEY                         # one operation and its whole history
//! idem --journal DIR resolve KEY --landed '{"id":"wire_42",...}' --note "on the bank statement"
//! idem --journal DIR resolve KEY --reissue --note "not on the statement after two days"
//! idem --journal DIR audit --from 0 --follow          # the audit stream, live
//! idem --journal DIR sagas                            # every saga and where it stands
//! idem --journal DIR tools | stats | prune
//! idem --postgres 'postgres://idem@/idem?host=/run/idem-pg' escalations   # a shared journal
//! idem --postgres 'postgres://owner@/idem?host=/run/idem-pg' migrate       # create its tables
//! ```
//!
//! With `--journal DIR` it finds the process that holds the journal through
//! the address file its admin API writes there (see `idem_runtime::admin`),
//! and talks to it over HTTP with the token in the same directory (or
//! `IDEM_ADMIN_TOKEN`). When no process holds the journal it opens it
//! itself: everything works then but `--landed`, which only the program
//! that defines a tool can check against the tool's result type, and
//! `audit --follow`.
//!
//! With `--postgres URL` it connects to the PostgreSQL journal that several
//! workers share, as one more client under a worker id of its own
//! (`idem-cli@HOST-PID`, see [`pg::worker_id`]): there is no process to ask
//! and no lock to wait for. Everything works but `--landed`, for the same
//! reason as above (it says to resolve through a worker's admin API with
//! `--url`); `audit --follow` polls the shared stream, since the events come
//! from other processes, and waits out a database it cannot reach (a
//! restart) instead of ending; `prune` needs `--keep`. Only `migrate` creates
//! the journal's tables: elsewhere a database without them is reported
//! (exit code 3), which is what a mistyped database name looks like, and the
//! role needs only the rows' privileges.
//!
//! Output is a table for people, JSON with `--json`; failures exit non-zero
//! (see [`error::exit`]) with the reason on stderr.
//!
//! The library is what the binary is made of: [`Client`] for the admin API,
//! [`Backend`] for where the commands go, [`pg`] for the PostgreSQL
//! connection, [`render`] for the tables.

pub mod args;
pub mod backend;
pub mod client;
pub mod error;
pub mod pg;
pub mod reach;
pub mod render;
pub mod workers;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser as _;
use idem_runtime::admin::ResolveRequest;
use idem_runtime::Resolution;

pub use backend::Backend;
pub use client::Client;
pub use error::CliError;

use args::{Cli, Command, How};
use error::exit;

/// The binary's entry point: parses the command line, runs it, prints the
/// error (if any) on stderr and returns the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idem: cannot start: {}", render::escape(&e.to_string()));
            return ExitCode::from(exit::UNREACHABLE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                eprintln!("{}", e.to_json());
            } else {
                eprint!("{}", render::error(&e));
            }
            ExitCode::from(e.code)
        }
    }
}

/// Runs one command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let keep = match &cli.command {
        Command::Prune { keep: Some(k) } => Some(parse_duration(k)?),
        _ => None,
    };
    if let Command::Migrate = cli.command {
        return migrate(&cli).await;
    }
    if let Command::Workers = cli.command {
        let found = workers::list().await?;
        return if cli.json {
            print(&format!(
                "{}\n",
                serde_json::to_string_pretty(&found).unwrap_or_default()
            ))
        } else {
            print(&render::workers(&found))
        };
    }
    if let Some(id) = &cli.worker {
        if cli.postgres.is_some() || cli.url.is_some() || cli.journal.is_some() {
            let from_env = ["IDEM_WORKER", "IDEM_ADMIN_URL", "IDEM_JOURNAL"]
                .into_iter()
                .filter(|v| std::env::var_os(v).is_some())
                .collect::<Vec<_>>();
            return Err(CliError::usage(format!(
                "give --worker ID alone, not with --journal, --url or --postgres{}",
                if from_env.is_empty() {
                    String::new()
                } else {
                    format!(" (set in the environment: {})", from_env.join(", "))
                }
            )));
        }
        let backend = Backend::worker(id).await?;
        return commands(cli, backend, keep).await;
    }
    let backend = match (&cli.postgres, &cli.url, &cli.journal) {
        (Some(url), None, None) => Backend::postgres(url, keep).await?,
        (Some(_), url, _) => {
            // Two journals named: which one is meant is a guess, so none.
            let (flag, env) = match url {
                Some(_) => ("--url", "IDEM_ADMIN_URL"),
                None => ("--journal", "IDEM_JOURNAL"),
            };
            let from_env = std::env::var_os(env).is_some();
            return Err(CliError::usage(format!(
                "give --postgres URL or {flag}, not both{}",
                if from_env {
                    format!(" ({env} is set in the environment)")
                } else {
                    String::new()
                }
            ))
            .hint(
                "--postgres URL is the shared PostgreSQL journal itself; --url and --journal \
                 name a process's admin API or a sled journal directory",
            ));
        }
        (None, Some(_), Some(_)) => {
            return Err(CliError::usage("give --journal DIR or --url URL, not both"))
        }
        (None, Some(url), None) => {
            let token = std::env::var(idem_runtime::admin::TOKEN_ENV).map_err(|_| {
                CliError::usage(format!(
                    "--url needs the token in {}",
                    idem_runtime::admin::TOKEN_ENV
                ))
            })?;
            let client = Client::new(url.clone(), token)?;
            // Through a tunnel the server's own address is not known here:
            // a proof of the challenge alone.
            match client
                .proves(idem_runtime::admin::proof::Binding::Any)
                .await
            {
                client::Proof::Proven => Backend::Remote(client),
                client::Proof::NoAnswer(why) => {
                    return Err(CliError::unreachable(format!(
                        "the admin API at {url} did not answer: {why}"
                    )))
                }
                client::Proof::Unproven(why) => return Err(client::unproven(url, &why)),
            }
        }
        (None, None, Some(dir)) => Backend::discover(dir, keep).await?,
        (None, None, None) => {
            return Err(CliError::usage(
                "which journal? give --journal DIR (or set IDEM_JOURNAL), --url URL or \
                 --postgres URL",
            ))
        }
    };
    commands(cli, backend, keep).await
}

/// Runs the command on the journal `backend` reaches.
async fn commands(
    cli: Cli,
    backend: Backend,
    keep: Option<std::time::Duration>,
) -> Result<(), CliError> {
    let json = cli.json;
    let as_json = |v: &dyn erased::Json| v.to_json_string();
    match cli.command {
        Command::Tools => match backend.tools().await? {
            Ok(tools) if json => print(&as_json(&tools)),
            Ok(tools) => print(&render::tools(&tools)),
            Err(names) if json => print(&as_json(&names)),
            Err(names) => print(&render::tool_names(&names, backend.no_registry())),
        },
        Command::Escalations => {
            let list = backend.escalations().await?;
            if json {
                print(&as_json(&list))
            } else {
                print(&render::escalations(&list, render::now_ms()))
            }
        }
        Command::Show { key } => {
            let view = backend.operation(&key).await?;
            if json {
                print(&as_json(&view))
            } else {
                print(&render::operation(&view))
            }
        }
        Command::Resolve { key, how, note } => {
            let request = ResolveRequest::new(&resolution(&how)?, note);
            request.to_resolution().map_err(CliError::usage)?;
            let resolved = backend.resolve(&key, &request).await?;
            if json {
                print(&as_json(&resolved))
            } else {
                print(&render::resolved(&resolved))
            }
        }
        Command::Approvals => {
            let list = backend.approvals().await?;
            if json {
                print(&as_json(&list))
            } else {
                print(&render::approvals(&list, render::now_ms()))
            }
        }
        Command::Sagas => {
            let list = backend.sagas().await?;
            if json {
                print(&as_json(&list))
            } else {
                print(&render::sagas(&list, render::now_ms()))
            }
        }
        command @ (Command::Approve { .. } | Command::Reject { .. }) => {
            let (approved, key, note) = match command {
                Command::Approve { key, note } => (true, key, note),
                Command::Reject { key, note } => (false, key, note),
                _ => unreachable!("matched above"),
            };
            let decided = backend.decide(&key, approved, note).await?;
            if json {
                print(&as_json(&decided))
            } else {
                print(&render::decided(&decided))
            }
        }
        Command::Audit {
            from,
            follow,
            limit,
        } => {
            if from != "end" && from.parse::<u64>().is_err() {
                return Err(CliError::usage(format!(
                    "--from {from:?}: expected a sequence number or `end`"
                )));
            }
            if !json {
                print(&render::audit_header())?;
            }
            backend
                .audit(&from, follow, limit, &mut |event| {
                    if json {
                        print(&format!("{}\n", event.to_json_line()))
                    } else {
                        print(&render::audit_line(&event))
                    }
                })
                .await?;
            if follow {
                eprintln!("idem: the stream ended: the process stopped serving it");
            }
            Ok(())
        }
        Command::Stats => {
            let stats = backend.stats().await?;
            if json {
                print(&as_json(&stats))
            } else {
                print(&render::stats(&stats))
            }
        }
        Command::Migrate | Command::Workers => {
            unreachable!("answered above, without a backend")
        }
        Command::Prune { .. } => {
            let report = backend.prune(keep).await?;
            if json {
                print(&as_json(&report))
            } else {
                print(&render::prune(&report))
            }
        }
    }
}

/// Writes `text` to stdout, flushed (a follower's lines must not wait in a
/// buffer).
fn print(text: &str) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
        .map_err(|e| CliError::new(exit::REFUSED, "output", format!("writing the output: {e}")))
}

/// `idem --postgres URL migrate`. Only the PostgreSQL journal has a schema
/// to create ahead of time: a sled journal is created by the process that
/// first opens it.
async fn migrate(cli: &Cli) -> Result<(), CliError> {
    let (Some(url), None, None) = (&cli.postgres, &cli.url, &cli.journal) else {
        return Err(CliError::usage(
            "migrate is for the PostgreSQL journal: give --postgres URL, and neither --journal \
             (IDEM_JOURNAL) nor --url (IDEM_ADMIN_URL)",
        )
        .hint("a sled journal needs no migration: the process that opens it creates it"));
    };
    let done = pg::migrate(url).await?;
    if cli.json {
        print(&serde_json::to_string_pretty(&done).unwrap_or_default())?;
        print("\n")
    } else {
        print(&render::migrated(&done))
    }
}

/// The resolution a command line asks for; `--landed` JSON is parsed here,
/// so a typo is reported before anything is sent.
fn resolution(how: &How) -> Result<Resolution, CliError> {
    let parse = |text: &str, from: &str| {
        serde_json::from_str::<serde_json::Value>(text)
            .map(|v| Resolution::Landed(Some(v)))
            .map_err(|e| {
                CliError::usage(format!("{from} is not JSON: {e}"))
                    .hint("quote it for the shell, e.g. --landed '{\"id\": \"wire_42\"}'")
            })
    };
    if let Some(text) = &how.landed {
        return parse(text, "--landed");
    }
    if let Some(file) = &how.landed_file {
        let text = if file.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin())
        } else {
            std::fs::read_to_string(file)
        }
        .map_err(|e| CliError::usage(format!("cannot read {}: {e}", file.display())))?;
        return parse(&text, &format!("{}", file.display()));
    }
    if how.reissue {
        return Ok(Resolution::Reissue);
    }
    if how.abandon {
        return Ok(Resolution::Abandon);
    }
    Err(CliError::usage(
        "say how: --landed JSON, --landed-file FILE, --reissue or --abandon",
    ))
}

/// `90s`, `30m`, `24h`, `7d`.
fn parse_duration(text: &str) -> Result<Duration, CliError> {
    let bad = || {
        CliError::usage(format!(
            "{text:?} is not a duration: a number and a unit (s, m, h, d), e.g. 7d"
        ))
    };
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60).ok_or_else(bad)?,
        "h" => n.checked_mul(3600).ok_or_else(bad)?,
        "d" => n.checked_mul(86_400).ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    Ok(Duration::from_secs(secs))
}

mod erased {
    /// Pretty JSON of anything serializable, behind one object-safe trait.
    pub trait Json {
        fn to_json_string(&self) -> String;
    }

    impl<T: serde::Serialize> Json for T {
        fn to_json_string(&self) -> String {
            let mut s = serde_json::to_string_pretty(self)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
            s.push('\n');
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_a_unit_only() {
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86_400)
        );
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("7").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("7w").is_err());
    }
}
